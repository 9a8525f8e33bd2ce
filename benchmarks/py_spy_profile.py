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
    print(f"# {name} {'GIL held' if samples == 'gil' else 'wall time'} (py-spy, {raw}): {shares}")
    for row in profile["top"]:
        print(f"#   {row['share']:6.1%}  {row['thread']}: {row['stack']}")


def read_profile(raw: Path, wall: float, top: int = 12) -> dict:
    """From a :func:`start_py_spy` file: ``share``, each thread's samples / (rate x ``wall`` seconds) (of
    its process's GIL with ``gil`` samples, of its own time with ``wall`` ones; with ``--subprocesses``
    each thread named after its process, ``server`` or ``engine process``), and ``top``, the ``top``
    stacks by samples (their three innermost frames, each as its share of the round)."""
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
    return {"share": {t: n / possible for t, n in sorted(threads.items(), key=lambda x: -x[1])},
            "top": [{"thread": t, "stack": st, "share": n / possible}
                    for (t, st), n in sorted(frames.items(), key=lambda x: -x[1])[:top]]}
