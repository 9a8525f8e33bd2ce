"""py-spy around a benchmark: record a process's threads while they hold the GIL, and read the record back.

``serve_load.py --py-spy`` samples the server (and its engine process) during a round: each thread's
share of its process's GIL and the stacks that hold it most (``benchmarks/RESULTS.md``, issue 48). Not a
benchmark itself: the scripts beside it import it (their folder is on ``sys.path``).
"""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

PY_SPY_RATE = 250  # samples a second


def start_py_spy(pid: int, out: Path) -> subprocess.Popen:
    """``py-spy record`` of process ``pid`` (every thread, only samples that hold the GIL, without
    pausing it) into ``out`` (collapsed stacks) until :func:`stop_py_spy`."""
    cmd = [py_spy_exe() or "py-spy", "record", "--pid", str(pid), "--subprocesses", "--threads", "--gil", "--nonblocking",
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


def print_profile(name: str, profile: dict, raw: Path) -> None:
    shares = ", ".join(f"{t} {v:.1%}" for t, v in profile["gil_share"].items())
    print(f"# {name} GIL held (py-spy, {raw}): {shares}")
    for row in profile["top"]:
        print(f"#   {row['share']:6.1%}  {row['thread']}: {row['stack']}")


def gil_profile(raw: Path, wall: float, top: int = 12) -> dict:
    """From a ``py-spy record --threads --gil`` file: each thread's share of its process's GIL over
    ``wall`` seconds (its samples / (rate x wall); with ``--subprocesses`` each thread named after
    its process, ``server`` or ``engine process``) and the ``top`` stacks by samples (their three
    innermost frames, each as its share of the round)."""
    threads: dict[str, int] = {}
    frames: dict[tuple[str, str], int] = {}
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
        thread = re.sub(r"^thread \(\d+\): ", "", names[0])
        if procs:
            thread = f"{'engine process' if 'spawn_main' in procs[-1] else 'server'} {thread}"
        key = thread, " < ".join(f.split(" (")[0] for f in names[1:][-1:-4:-1])  # the 3 innermost frames
        threads[thread] = threads.get(thread, 0) + int(n)
        frames[key] = frames.get(key, 0) + int(n)
    possible = PY_SPY_RATE * wall
    return {"gil_share": {t: n / possible for t, n in sorted(threads.items(), key=lambda x: -x[1])},
            "top": [{"thread": t, "stack": st, "share": n / possible}
                    for (t, st), n in sorted(frames.items(), key=lambda x: -x[1])[:top]]}
