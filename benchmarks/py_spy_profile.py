"""py-spy around a benchmark: record a process's threads, and read the record back.

``serve_load.py --py-spy`` samples the server (and its engine process) during a round. Two kinds of
samples (:data:`SAMPLES`): ``gil``, only those that hold the GIL (each thread's share of its process's
GIL: is one interpreter the limit?), and ``wall``, every sample, idle and waiting ones too (where each
thread's wall time goes: a wait on the device, a queue, a lock). Each thread's share of the round and the
stacks seen most (``benchmarks/RESULTS.md``, issue 48). Not a benchmark itself: the scripts beside it
import it (their folder is on ``sys.path``).
"""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

PY_SPY_RATE = 250  # samples a second
#: What a sample is: one that holds the GIL, or any (py-spy's ``--gil`` or ``--idle``).
SAMPLES = ("gil", "wall")


def start_py_spy(pid: int, out: Path, samples: str = "gil") -> subprocess.Popen:
    """``py-spy record`` of process ``pid`` and its children (every thread, without pausing them) into
    ``out`` (collapsed stacks) until :func:`stop_py_spy`; ``samples``: :data:`SAMPLES`.

    Raises:
        ValueError: ``samples`` is not one of :data:`SAMPLES`."""
    if samples not in SAMPLES:
        raise ValueError(f"py-spy samples must be one of {', '.join(SAMPLES)}, got {samples!r}")
    cmd = [py_spy_exe() or "py-spy", "record", "--pid", str(pid), "--subprocesses", "--threads",
           "--gil" if samples == "gil" else "--idle", "--nonblocking",
           "--rate", str(PY_SPY_RATE),
           "--format", "raw", "--output", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def py_spy_exe() -> str | None:
    """py-spy on PATH, or beside this Python (pip's scripts folder); None when neither."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.is_file() else None)


def stop_py_spy(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        err = "py-spy did not stop within 60 s"
    if proc.returncode not in (0, -signal.SIGINT, 130):
        print(f"# py-spy exited with {proc.returncode}: {err.strip()[-500:]}", file=sys.stderr)


def print_profile(name: str, profile: dict, raw: Path, samples: str = "gil") -> None:
    shares = ", ".join(f"{t} {v:.1%}" for t, v in profile["share"].items())
    helpers = f"; {profile['helpers']} helper processes left out" if profile.get("helpers") else ""
    print(f"# {name} {'GIL held' if samples == 'gil' else 'wall time'} (py-spy, {raw}): {shares}{helpers}")
    for row in profile["top"]:
        print(f"#   {row['share']:6.1%}  {row['thread']}: {row['stack']}")


def read_profile(raw: Path, wall: float, per_thread: int = 4, least: float = 0.02) -> dict:
    """From a :func:`start_py_spy` file: ``share``, each thread's samples / (rate x ``wall`` seconds) (of
    its process's GIL with ``gil`` samples, of its own time with ``wall`` ones), and ``top``, each
    thread's stacks seen most, the thread's share first (their three innermost frames, each as its share
    of the round; at most ``per_thread`` a thread, those of at least ``least`` of it). Threads of one
    name (a pool's workers) are one entry, named with their count (``AnyIO worker thread x40``), and
    their figures are the mean thread's.

    With ``--subprocesses`` each thread is named after its process (:func:`process_role`): ``server``
    (the sampled process) or ``engine process`` (its spawned child). Other processes (the compile
    workers of Inductor, pools forked by either) are left out of both and counted in ``helpers``: they
    wait idle through a round, and with ``wall`` samples their waits would fill ``top``."""
    ids: dict[str, set[str]] = {}
    frames: dict[str, dict[str, int]] = {}  # thread -> its stacks' samples
    helpers: set[str] = set()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        procs = []  # with --subprocesses: 'process PID:"CMDLINE";' frames first, the owner last
        while stack.startswith("process ") and '";' in stack:
            end = stack.index('";') + 2  # a command line may hold ';' itself
            procs.append(stack[:end])
            stack = stack[end:]
        names = stack.split(";")
        tid = re.match(r"^thread \((\d+)\): ", names[0])
        thread = names[0][tid.end():] if tid else names[0]
        if procs:
            role = process_role(procs)
            if role is None:
                helpers.add(procs[-1].split(":", 1)[0])
                continue
            thread = f"{role} {thread}"
        where = " < ".join(f.split(" (")[0] for f in names[1:][-1:-4:-1])  # the 3 innermost frames
        ids.setdefault(thread, set()).add(tid.group(1) if tid else "")
        own = frames.setdefault(thread, {})
        own[where] = own.get(where, 0) + int(n)
    threads = {t: sum(own.values()) for t, own in frames.items()}  # each thread's samples
    count = {t: len(v) for t, v in ids.items()}
    name = lambda t: f"{t} x{count[t]}" if count[t] > 1 else t  # noqa: E731
    possible = {t: PY_SPY_RATE * wall * count[t] for t in threads}  # the mean thread's samples
    order = sorted(threads, key=lambda t: -threads[t] / possible[t])
    top = [{"thread": name(t), "stack": st, "share": n / possible[t]}
           for t in order
           for st, n in sorted(frames[t].items(), key=lambda x: -x[1])[:per_thread] if n / possible[t] >= least]
    return {"share": {name(t): threads[t] / possible[t] for t in order}, "top": top,
            "helpers": len(helpers)}


def process_role(procs: list[str]) -> str | None:
    """``server`` for the sampled process, ``engine process`` for a child of it started by
    ``multiprocessing``'s spawn, None for any other; ``procs``: a sample's ``process PID:"CMDLINE";``
    frames, the sampled process first and the sample's own last."""
    if len(procs) == 1:
        return "server"
    return "engine process" if len(procs) == 2 and "spawn_main" in procs[-1] else None
