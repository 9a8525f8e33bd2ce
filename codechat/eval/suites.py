"""Evaluation suites: sample HumanEval / MBPP solutions with the engine, judge them in the sandbox.

``codechat eval run`` (:mod:`codechat.eval.cli`) and :func:`run_suite` do the same thing:

1. load the problems (:func:`codechat.eval.problems.load_problems`): HumanEval from the copy
   shipped with codechat (or ``humaneval:PATH``), MBPP from a local ``mbpp.jsonl`` in its
   published format (``mbpp:PATH``) with its standard splits by task id;
2. build one prompt per problem for the *mode*, which follows the checkpoint's stage
   (``pretrain`` -> ``base``, anything else -> ``chat``) unless overridden:

   - ``chat``: one user turn, exactly as SFT renders these datasets
     (:data:`codechat.data.formats.MBPP_PROMPT`: the problem text, "Your code should pass
     these tests:" and the three asserts; :data:`~codechat.data.formats.HUMANEVAL_PROMPT`: the
     signature and docstring), rendered with :func:`codechat.chat.conversation.render_for_completion`. The
     answer ends at ``<|end|>``; its code is found by :func:`codechat.eval.extract.extract_code`;
   - ``base``: completion mode after ``<|end|>`` (the document separator of the pretraining
     corpus, so the prompt starts where a document starts). HumanEval's prompt is continued
     until one of :data:`HUMANEVAL_STOPS` (Chen et al. 2021); MBPP uses the MBPP paper's
     protocol (Austin et al. 2021): ``shots`` solved examples from tasks 2-4, then the task, the
     code delimited by ``[BEGIN]`` / ``[DONE]`` (:data:`MBPP_STOPS`);

3. sample ``n`` completions per problem through one :class:`codechat.engine.Engine`, batching
   across problems (continuous batching over ``batch_size`` KV-cache slots; a problem's ``n``
   samples share one prefill);
4. judge each in :mod:`codechat.eval.sandbox` (``workers`` in parallel, overlapping generation) and
   append it to ``OUT/samples.jsonl`` with its result as soon as it is judged;
5. write ``OUT/results.json`` atomically: pass@k per k, pass@1 and its standard error, counts
   per result kind, how generations ended, timing, and the pre-RL verdict with its band.

Resuming: a rerun with the same ``OUT`` skips every ``(task_id, sample)`` already in
``samples.jsonl``. Sample ``i`` of a problem is the engine's random stream ``i`` of a seed derived
from ``(seed, task_id)`` (:func:`derive_seed`), so the regenerated samples are the ones an
uninterrupted run would have drawn (same device and software), whatever the batch held.
The settings that change what a sample is (mode, temperature, seed, limits, ...) are kept in
``OUT/run.json``; a rerun with other settings is refused. ``n``, ``limit`` and ``batch_size`` may
change: results use samples ``0..n-1`` of the selected problems.

``samples.jsonl`` fields: ``suite``, ``split``, ``task_id``, ``sample``, ``mode``, ``prompt``
(the user turn), ``entry_point``, ``tests`` and ``test_setup_code`` (what a program is judged
with: the solution, then ``test_setup_code``, then each test), ``completion`` (the model's text,
cut at a stop), ``finish`` (``stop_sequence``, ``stop_token``, ``length`` or ``no_room`` when
the prompt fills the model's context), ``n_tokens``, ``code`` (the solution judged),
``status`` (a :data:`codechat.eval.sandbox.STATUSES` value), ``passed``, ``tests_passed``,
``tests_total``, ``error``, ``wall_s``. ``codechat eval filter`` reads it as is.
"""
from __future__ import annotations

import hashlib
import json
import os
import textwrap
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from tqdm.auto import tqdm

from codechat.config.atomic import write_text
from codechat.eval import sandbox
from codechat.eval.extract import defines, extract_code, parse_quietly
from codechat.eval.passk import pass_figures, verdict, verdict_band
from codechat.eval.problems import Problem, load_problems

MODES = ("auto", "chat", "base")
#: Stop sequences of HumanEval completion mode (Chen et al. 2021): a new top-level statement.
HUMANEVAL_STOPS = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")
#: Suites whose base prompt opens the target function (imports, signature, docstring): base mode continues
#: it as HumanEval's (stops, prompt + completion judged). The corpus-mined RL tasks (data/doctest_tasks, io_tasks).
FUNCTION_PROMPT_SUITES = ("humaneval", "doctest", "io")
#: Stop sequences of MBPP completion mode: the paper's ``[DONE]``, the start of another example,
#: and top-level test or script code (a top-level ``def``/``class`` may be a helper, so it stays).
MBPP_STOPS = ("[DONE]", "\n[BEGIN]", "\nYou are an expert", "\nassert", "\nprint(", "\nif __name__")


# ----------------------------------------------------------------------------- completions
def truncate_at_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Index of the earliest stop sequence in ``text`` ending after ``start`` (None if none)."""
    found = [i for s in stops if (i := text.find(s, max(0, start - len(s) + 1))) >= 0]
    return min(found) if found else None


def solution_code(problem: Problem, mode: str, completion: str) -> str:
    """The code judged for ``completion``, the model's (already stop-truncated) text.

    Base mode: the prompt + the completion where the prompt opens the function
    (:data:`FUNCTION_PROMPT_SUITES`: HumanEval, mined tasks); MBPP's completion. Chat mode:
    :func:`extract_code` of the answer; for HumanEval the prompt's header (imports and helper
    functions it defines) comes first, and an answer that is only the function's body is put
    under the prompt's signature. An answer with no code is ``""`` in every suite (the sandbox's
    ``syntax`` status, "the program has no code"), not HumanEval's header alone.
    """
    if mode == "base":
        if problem.suite in FUNCTION_PROMPT_SUITES:
            return problem.base_prompt + completion
        return textwrap.dedent(completion).strip("\n")
    code = extract_code(completion, problem.entry_point)
    if problem.suite != "humaneval" or not code.strip():
        return code
    if not defines(code, problem.entry_point or ""):
        as_body = problem.base_prompt + textwrap.indent(textwrap.dedent(code), "    ")
        if parse_quietly(as_body) is not None:
            return as_body
    return problem.header + code


@dataclass(frozen=True)
class Generation:
    """One sampled completion: its text (cut at a stop), tokens generated, and how it ended."""

    text: str
    n_tokens: int
    finish: str  # "stop_sequence" | "stop_token" | "length" | "no_room"


#: Recorded in ``run.json``: samples drawn by another version of the sampler are not mixed in.
SAMPLER_VERSION = "engine-2"


@dataclass(frozen=True)
class Job:
    """The samples ``samples`` (indices) of ``problem`` to draw from ``prompt_ids`` with ``seed``."""

    problem: Problem
    prompt_ids: list[int]
    samples: tuple[int, ...]
    seed: int


#: ``sampler(jobs) -> (job, sample index, Generation)`` for every sample of every job, in any order,
#: pulling jobs only as it has room for them; :class:`ModelSampler` is the real one.
Sampler = Callable[[Iterator[Job]], Iterator[tuple[Job, int, Generation]]]


class ModelSampler:
    """Samples every job through one :class:`codechat.engine.Engine`, batching across problems.

    Jobs are pulled while the engine has free rows (continuous batching: a finished sample's slot
    takes the next one at once); the ``n`` samples of a job share one prefill. Every row stops at
    a control token (chat: the end of the assistant turn); in base mode a row also stops at the
    first of ``stop_sequences`` in its incrementally decoded text (its engine row is cancelled).
    A prompt that leaves fewer than ``cfg.max_new_tokens`` positions in the context gets what is
    left (finish ``length``); one that leaves none is not generated (``no_room``).
    """

    def __init__(self, engine: Any, tok: Any, cfg: Any, *, mode: str, stop_sequences: Sequence[str] = ()) -> None:
        from codechat.chat.calls import FUNCTION_CALL_TOKEN
        self.engine, self.tok, self.cfg, self.mode = engine, tok, cfg, mode
        self.stop_sequences = tuple(stop_sequences)
        self.stop_ids = sorted(tok.special_ids - {tok.special_id(FUNCTION_CALL_TOKEN)})

    def __call__(self, jobs: Iterator[Job]) -> Iterator[tuple[Job, int, Generation]]:
        from dataclasses import replace

        from codechat.chat.calls import parse_assistant
        from codechat.engine import Request
        eng, stop = self.engine, set(self.stop_ids)
        rows: dict[tuple[int, int], dict[str, Any]] = {}
        owner: dict[int, list] = {}  # request id -> [job, rows not yet yielded]
        queued = 0  # rows added and not yet finished
        jobs = iter(jobs)
        more = True
        while True:
            while more and queued < 2 * eng.slots:  # keep the engine's queue a little ahead of its slots
                job = next(jobs, None)
                if job is None:
                    more = False
                    break
                room = eng.max_len - len(job.prompt_ids)
                if room <= 0:
                    for i in job.samples:
                        yield job, i, Generation("", 0, "no_room")
                    continue
                cfg = replace(self.cfg, max_new_tokens=min(self.cfg.max_new_tokens, room))
                rid = eng.add(Request(job.prompt_ids, cfg, samples=job.samples, seed=job.seed, stop_ids=self.stop_ids))
                owner[rid] = [job, len(job.samples)]
                for i in job.samples:
                    rows[rid, i] = {"ids": [], "text": "", "stream": self.tok.stream(), "finish": None}
                queued += len(job.samples)
            if not eng.has_work():
                return
            for ev in eng.step():
                r = rows.get((ev.request, ev.sample))
                if r is None or r["finish"]:
                    continue
                if ev.token in stop:
                    r["finish"] = "stop_token"
                else:
                    r["ids"].append(ev.token)
                    if self.mode == "base":
                        before = len(r["text"])
                        r["text"] += r["stream"].push(ev.token)
                        cut = truncate_at_stop(r["text"], self.stop_sequences, before)
                        if cut is not None:
                            r["text"], r["finish"] = r["text"][:cut], "stop_sequence"
                            eng.cancel(ev.request, ev.sample)
                    if ev.finish == "length" and not r["finish"]:
                        r["finish"] = "length"
                if r["finish"]:
                    queued -= 1
                    del rows[ev.request, ev.sample]
                    job = owner[ev.request][0]
                    if self.mode == "chat":
                        text = parse_assistant(self.tok, r["ids"])[0]
                    else:
                        text = r["text"] if r["finish"] == "stop_sequence" else r["text"] + r["stream"].flush()
                    owner[ev.request][1] -= 1
                    if not owner[ev.request][1]:
                        del owner[ev.request]
                        eng.pop(ev.request)
                    yield job, ev.sample, Generation(text, len(r["ids"]), r["finish"])


def resolve_mode(mode: str, stage: str) -> str:
    """``chat`` or ``base``: ``auto`` follows the stage (``pretrain`` is a base model)."""
    if mode not in MODES:
        raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode if mode != "auto" else ("base" if stage == "pretrain" else "chat")


def prompt_ids(tok: Any, problem: Problem, mode: str) -> list[int]:
    """Token ids generation starts from: the rendered user turn (chat) or ``<|end|>`` + text (base)."""
    if mode == "chat":
        from codechat.chat.conversation import Conversation, Message, render_for_completion
        return render_for_completion(tok, Conversation((Message("user", problem.prompt),)))
    return [tok.end_id] + tok.encode(problem.base_prompt)


def check_ks(ks: Sequence[int], n: int) -> list[int]:
    """Sorted distinct ``ks``, each in ``1..n``; pass@k needs at least k samples per problem.

    Raises:
        ValueError: no k, a k < 1, or a k > n (checked before anything is generated).
    """
    ks = sorted(set(int(k) for k in ks))
    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")
    if not ks or ks[0] < 1:
        raise ValueError(f"--k needs values >= 1, got {ks}")
    if ks[-1] > n:
        raise ValueError(f"pass@{ks[-1]} needs at least {ks[-1]} samples per problem but --n is {n}: "
                         f"raise --n to {ks[-1]} or drop k={ks[-1]}")
    return ks


def derive_seed(seed: int, task_id: str | int) -> int:
    """A problem's sampling seed; its sample ``i`` is the engine's stream ``(seed, i)``, so it is
    the same across runs, limits, resumes and batch compositions."""
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


# ----------------------------------------------------------------------------- samples.jsonl
def _key(task_id: str | int, sample: int) -> tuple[str, int]:
    return json.dumps(task_id), int(sample)


def read_samples(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Samples already judged, by ``(json task_id, sample)``; the first row of a key wins.

    A last line cut off by a crash (no newline) is removed from the file, with a warning, so
    appends stay line-aligned.

    Raises:
        ValueError: a malformed line before the last one.
    """
    if not path.is_file():
        return {}
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        keep = raw.rfind(b"\n") + 1
        warnings.warn(f"{path}: dropping an unfinished last line ({len(raw) - keep} bytes) left by an interrupted run")
        with open(path, "r+b") as f:
            f.truncate(keep)
        raw = raw[:keep]
    done: dict[tuple[str, int], dict[str, Any]] = {}
    for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            key = _key(row["task_id"], row["sample"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{lineno}: not a sample row ({type(e).__name__}: {e})") from None
        done.setdefault(key, row)
    return done


def check_run_settings(path: Path, settings: dict[str, Any], have_samples: bool) -> None:
    """Record ``settings`` in ``path`` (an ``OUT/run.json``), refusing an ``OUT`` that holds samples
    made with other settings; a ``model`` of None on either side matches any model.

    Every suite guards its ``--out`` with it: :func:`run_suite` (which then resumes) and
    :func:`codechat.eval.funcall.run_funcall_suite` (which then regenerates).

    Raises:
        ValueError: ``have_samples`` and ``path`` records other settings (each difference named).
    """
    if path.is_file():
        old = json.loads(path.read_text())
        diff = {k: (old.get(k), v) for k, v in settings.items()
                if old.get(k) != v and not (k == "model" and (v is None or old.get(k) is None))}
        if diff and have_samples:
            what = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"{path.parent} holds samples made with other settings ({what}); use another --out, "
                             "or delete that directory to start over")
    write_text(path, json.dumps(settings, indent=1))


# ----------------------------------------------------------------------------- the suite
def run_suite(model: Any, tok: Any, *, out_dir: str | Path, suite: str | Sequence[Problem] = "humaneval",
              split: str = "test", stage: str = "pretrain", mode: str = "auto", n: int = 20,
              ks: Sequence[int] = (1, 10), temperature: float = 0.8, top_p: float = 0.95, top_k: int = 0,
              max_new_tokens: int = 512, limit: int | None = None, seed: int = 0, shots: int = 3,
              batch_size: int = 0, workers: int = 2, timeout_s: float = 10.0, memory_mb: int = 1024,
              model_id: str | None = None, progress: bool = True, sampler: Sampler | None = None,
              box: sandbox.Sandbox | None = None, deadline_s: float | None = None) -> dict[str, Any]:
    """Sample, judge and score one suite into ``out_dir``; returns what ``results.json`` holds.

    Args:
        model, tok: a :class:`codechat.model.GPT` in eval mode (or an :class:`codechat.engine.Engine`
            already built on one) and its tokenizer (``checkpoint.load_model``). ``model`` is
            unused when ``sampler`` is given.
        suite: ``"humaneval"``, ``"humaneval:PATH"``, ``"mbpp:PATH"``, or problems already loaded.
        stage: the checkpoint's ``meta.stage``; ``mode="auto"`` picks base for ``"pretrain"``.
        n, ks: samples per problem and the k of each pass@k (every k <= n).
        temperature, top_p, top_k, max_new_tokens: sampling (:class:`codechat.engine.SamplingConfig`).
        limit: only the first ``limit`` problems. seed: base of every problem's seed (:func:`derive_seed`).
        shots: MBPP base-mode examples (0-3). batch_size: rows decoded at once, across problems
            (the engine's KV-cache slots; 0: the engine's default). Samples do not depend on it.
        workers, timeout_s, memory_mb: sandbox judging (parallel programs, 0: one per CPU core;
            limits per program).
        model_id: recorded, and compared on resume (e.g. the checkpoint path and step).
        sampler: replaces the model (tests feed known completions through the same path).
        box: a sandbox pool to reuse (default: one of ``workers`` fork servers, closed after).
        deadline_s: seconds after which no new problem is started (None: no limit); the results
            cover the problems whose ``n`` samples were all judged (``problems``), out of
            ``problems_planned``.

    Raises:
        ValueError: bad settings (k > n first, before anything is loaded or generated), or an
            ``out_dir`` holding samples made with other settings.
    """
    ks = check_ks(ks, n)
    mode = resolve_mode(mode, stage)
    if batch_size < 0 or workers < 0:
        raise ValueError(f"batch_size and workers must be >= 0, got {batch_size} and {workers}")
    workers = workers or os.cpu_count() or 2
    if isinstance(suite, str):
        spec, problems = suite, load_problems(suite, split, limit=limit, shots=shots)
    else:
        problems = list(suite)[:limit] if limit else list(suite)
        spec = problems[0].suite if problems else "?"
    if not problems:
        raise ValueError("no problems to evaluate")
    name = problems[0].suite
    if sampler is None:
        from codechat.engine import Engine, EngineConfig, SamplingConfig
        cfg = SamplingConfig(max_new_tokens, temperature, top_k, top_p)
        stops = () if mode == "chat" else (HUMANEVAL_STOPS if name in FUNCTION_PROMPT_SUITES else MBPP_STOPS)
        engine = model if isinstance(model, Engine) else Engine(model, EngineConfig(slots=batch_size))
        sampler = ModelSampler(engine, tok, cfg, mode=mode, stop_sequences=stops)
    if temperature == 0 and n > 1:
        warnings.warn(f"temperature 0 is greedy: the {n} samples of a problem are identical; use --n 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    samples_path = out / "samples.jsonl"
    settings = {"suite": spec, "split": split, "mode": mode, "temperature": temperature, "top_p": top_p,
                "top_k": top_k, "max_new_tokens": max_new_tokens, "shots": shots if name == "mbpp" else None,
                "seed": seed, "timeout_s": timeout_s, "memory_mb": memory_mb, "model": model_id,
                "sampler": SAMPLER_VERSION}
    done = read_samples(samples_path)
    check_run_settings(out / "run.json", settings, bool(done))
    todo = [(p, {i for i in range(n) if _key(p.task_id, i) not in done}) for p in problems]
    n_todo = sum(len(m) for _, m in todo)

    t0 = time.perf_counter()
    stats = {"generate_s": 0.0, "tokens": 0, "new": 0, "passed": 0}
    lock, stopping = threading.Lock(), threading.Event()
    bar = tqdm(total=len(problems) * n, initial=len(problems) * n - n_todo, unit="sample",
               desc=f"{name} ({mode})", disable=not progress, dynamic_ncols=True)

    def judge(p: Problem, i: int, g: Generation, f: Any, pool_box: sandbox.Sandbox) -> None:
        code = solution_code(p, mode, g.text)
        res = pool_box.run(p.program(code), p.tests, timeout_s=timeout_s, memory_mb=memory_mb)
        row = {**p.row(), "sample": i, "mode": mode, "completion": g.text, "finish": g.finish,
               "n_tokens": g.n_tokens, "code": code, "status": res.status, "passed": res.passed,
               "tests_passed": res.tests_passed, "tests_total": res.tests_total, "error": res.error,
               "wall_s": round(res.wall_s, 4)}
        line = json.dumps(row, ensure_ascii=False) + "\n"
        with lock:
            if stopping.is_set():  # the sandbox is being torn down: this result may be an artefact
                return
            f.write(line)
            f.flush()
            stats["new"] += 1
            stats["passed"] += res.passed
            bar.set_postfix(passed=f"{stats['passed']}/{stats['new']}", refresh=False)
            bar.update(1)

    with ExitStack() as stack:
        pool_box = box or stack.enter_context(sandbox.Sandbox(workers))
        f = stack.enter_context(open(samples_path, "a", encoding="utf-8"))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="judge")
        futures: list[Future] = []
        started = [bool(done)]

        def jobs() -> Iterator[Job]:
            for p, missing in todo:
                if not missing:
                    continue
                if deadline_s is not None and time.perf_counter() - t0 >= deadline_s and started[0]:
                    return  # out of time, with at least one problem sampled (here or in an earlier run)
                started[0] = True
                yield Job(p, prompt_ids(tok, p, mode), tuple(sorted(missing)), derive_seed(seed, p.task_id))

        try:
            t = time.perf_counter()
            for job, i, g in sampler(jobs()):
                stats["generate_s"] += time.perf_counter() - t
                stats["tokens"] += g.n_tokens
                futures.append(pool.submit(judge, job.problem, i, g, f, pool_box))
                # forget finished judgements; .result() re-raises a judging error as soon as it happens
                futures = [x for x in futures if not x.done() or x.result() is not None]
                t = time.perf_counter()
            for fut in futures:
                fut.result()
        except BaseException:
            try:
                pool.shutdown(wait=True, cancel_futures=True)  # let running judgements finish and be written
            finally:
                stopping.set()
                bar.close()
            raise
        pool.shutdown(wait=True)
    bar.close()
    judged = read_samples(samples_path)
    finished = [p for p in problems if all(_key(p.task_id, i) in judged for i in range(n))]
    results = summarise(judged, finished, n, ks)
    results["problems_planned"] = len(problems)
    results.update(suite=name, suite_spec=spec, split=split, mode=mode, stage=stage, model=model_id, settings=settings)
    results["timing"] = {"wall_s": time.perf_counter() - t0, "generate_s": stats["generate_s"],
                         "samples_new": stats["new"], "samples_resumed": len(problems) * n - n_todo,
                         "tokens_new": stats["tokens"],
                         "tokens_per_s": stats["tokens"] / stats["generate_s"] if stats["generate_s"] else None}
    if results["prompt_overflow"]:
        warnings.warn(f"{results['prompt_overflow']} of {len(problems)} prompts fill the model's context "
                      "(max_seq_len): their samples are empty and count as failures")
    write_text(out / "results.json", json.dumps(results, indent=1))
    return results


def summarise(done: dict[tuple[str, int], dict[str, Any]], problems: Sequence[Problem], n: int,
              ks: Sequence[int]) -> dict[str, Any]:
    """pass@k, pass@1 (+ standard error over problems), counts and the verdict from judged samples.

    Raises:
        ValueError: a problem has fewer than ``n`` judged samples.
    """
    per_task, counts, finish = {}, {s: 0 for s in sandbox.STATUSES}, {}
    overflow = 0
    for p in problems:
        rows = [done.get(_key(p.task_id, i)) for i in range(n)]
        if None in rows:
            raise ValueError(f"{p.task_id}: only {n - rows.count(None)} of {n} samples are judged")
        c = sum(bool(r["passed"]) for r in rows)
        per_task[str(p.task_id)] = {"n": n, "c": c}
        for r in rows:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
            finish[r["finish"]] = finish.get(r["finish"], 0) + 1
        overflow += any(r["finish"] == "no_room" for r in rows)
    figures = pass_figures(per_task, ks)
    p1 = figures["pass@1"]
    return {"problems": len(problems), "n": n, "ks": list(ks), "samples": len(problems) * n, **figures,
            "verdict": verdict(p1), "verdict_band": verdict_band(p1), "counts": counts, "finish": finish,
            "prompt_overflow": overflow, "per_task": per_task}


def format_summary(results: dict[str, Any]) -> str:
    """A few printable lines: pass@k, counts, timing and the verdict."""
    r = results
    cut = r.get("problems_planned", r["problems"]) - r["problems"]
    lines = [f"{r['suite']} ({r['mode']}, {r['problems']} problems x {r['n']} samples"
             + (f"; {cut} of the {r['problems_planned']} planned not started: the deadline passed" if cut > 0 else "")
             + "): "
             + ", ".join(f"{k} {v:.2%}" for k, v in r["pass@k"].items()),
             "results: " + ", ".join(f"{k} {v}" for k, v in r["counts"].items() if v),
             "generations ended by: " + ", ".join(f"{k} {v}" for k, v in sorted(r["finish"].items()))]
    t = r.get("timing")
    if t:
        lines.append(f"time {t['wall_s']:.1f} s ({t['generate_s']:.1f} s generating); "
                     f"{t['samples_new']} new samples, {t['samples_resumed']} resumed")
    lines.append(f"verdict: {r['verdict']}")
    return "\n".join(lines)
