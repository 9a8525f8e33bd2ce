"""Peak memory of `codechat data corpus` on a synthetic JSONL file larger than what it may hold (default 1 GB).

What it does, in a temporary directory (removed afterwards unless ``--keep``):

1. writes ``data.jsonl``: records ``{"id", "repo", "content"}`` whose ``content`` is a slice
   (1-16 KB) of a file of this Python's standard library under a unique header line, so no
   record is a duplicate, until the file holds ``--gb`` GB;
2. trains a tokenizer on its first ``--tok-mb`` MB with ``codechat tokenizer train --src data.jsonl``
   (the same reader);
3. runs ``codechat data corpus --src data.jsonl --workers N`` as a subprocess and samples its
   process tree (the command and its spawned tokenising workers) every ``--every`` seconds
   from ``/proc``.

Figures (one line each): input size and time; per process its peak resident set (``VmHWM`` from
``/proc/PID/status``, exact per process); the sum of the workers' peaks and of all peaks (an upper
bound on the tree's simultaneous peak: the peaks need not coincide, and shared library pages count
once per process); the largest sampled simultaneous total of RSS and of PSS (proportional set size:
shared pages split between the processes sharing them), and the ``ru_maxrss`` that ``os.wait4``
returns for the command (the kernel's largest single-process peak in its tree, a cross-check). The
verdict compares the sum of all peaks with ``--limit-gb`` (default 1 GB).

    python benchmarks/corpus_memory.py [--gb 1] [--workers 2] [--tok-mb 8] [--vocab-size 8192] [--keep]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30
MiB = 1 << 20


def write_jsonl(path: Path, n_bytes: int, seed: int = 0) -> tuple[int, int]:
    """Write records until the file holds ``n_bytes``; returns (records, bytes of content text)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))]
    texts = [t for t in texts if len(t) > 2048]
    rng = random.Random(seed)
    written = records = text_bytes = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < n_bytes:
            src = texts[rng.randrange(len(texts))]
            size = rng.randint(1024, 16384)
            start = rng.randrange(max(1, len(src) - size))
            content = f"# synthetic document {records}\n{src[start:start + size]}"
            line = json.dumps({"id": records, "repo": f"org/repo{records % 997}", "content": content}) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
            text_bytes += len(content.encode("utf-8"))
            records += 1
    return records, text_bytes


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from ``/proc/PID/task/TID/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def _status_kb(pid: int, *keys: str) -> dict[str, int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return {}
    return {k: int(fields[k].split()[0]) for k in keys if k in fields}


def _kind(pid: int) -> str:
    """``worker`` for a spawned pool process, ``tracker`` for multiprocessing's resource tracker."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return "tracker" if b"resource_tracker" in f.read() else "worker"
    except OSError:
        return "worker"


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
    except OSError:
        return 0


def run_sampled(cmd: list[str], log: Path, every: float, timeout: float) -> dict:
    """Run ``cmd`` (output to ``log``), sampling its process tree; returns peaks (KiB) and the exit status.

    The child is reaped with ``os.wait4``, whose ``ru_maxrss`` is the largest peak of the child and
    of the descendants it waited for (its pool workers), and of nothing else this script ran.
    """
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    hwm: dict[int, int] = {}
    names: dict[int, str] = {}
    peak_rss = peak_pss = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - start > timeout:
            proc.kill()
        rss_total = pss_total = 0
        for pid in _tree(proc.pid):
            st = _status_kb(pid, "VmRSS", "VmHWM")
            if not st:
                continue
            hwm[pid] = max(hwm.get(pid, 0), st.get("VmHWM", 0))
            names.setdefault(pid, "command" if pid == proc.pid else _kind(pid))
            rss_total += st.get("VmRSS", 0)
            pss_total += _pss_kb(pid)
        peak_rss, peak_pss = max(peak_rss, rss_total), max(peak_pss, pss_total)
        time.sleep(every)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "seconds": time.perf_counter() - start, "output": log.read_text(errors="replace"),
            "hwm": hwm, "names": names, "peak_rss": peak_rss, "peak_pss": peak_pss, "tree_maxrss": usage.ru_maxrss}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="size of the synthetic JSONL file, GiB (default 1)")
    ap.add_argument("--workers", type=int, default=2, help="tokenising processes (default 2)")
    ap.add_argument("--tok-mb", type=int, default=8, help="MiB of the file the tokenizer is trained on (default 8)")
    ap.add_argument("--vocab-size", type=int, default=8192, help="tokenizer vocabulary (default 8192)")
    ap.add_argument("--every", type=float, default=0.2, help="seconds between samples of /proc (default 0.2)")
    ap.add_argument("--limit-gb", type=float, default=1.0, help="the bound to check, GiB (default 1)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds before the corpus command is killed")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    env_py = [sys.executable, "-m", "codechat"]
    tmp = Path(tempfile.mkdtemp(prefix="corpus_memory_"))
    try:
        data = tmp / "data.jsonl"
        t0 = time.perf_counter()
        records, text_bytes = write_jsonl(data, int(args.gb * GiB))
        print(f"input: {data.stat().st_size / GiB:.3f} GiB JSONL, {records} records, {text_bytes / GiB:.3f} GiB of "
              f"content text (written in {time.perf_counter() - t0:.0f} s)")
        t0 = time.perf_counter()
        subprocess.run(env_py + ["tokenizer", "train", "--src", str(data), "--max-bytes", str(args.tok_mb * MiB),
                                 "--vocab-size", str(args.vocab_size), "--out", str(tmp / "tok")],
                       cwd=ROOT, check=True, capture_output=True)
        print(f"tokenizer: vocab {args.vocab_size} on the first {args.tok_mb} MiB of the train split "
              f"({time.perf_counter() - t0:.0f} s)")
        r = run_sampled(env_py + ["data", "corpus", "--src", str(data), "--tokenizer", str(tmp / "tok"), "--out",
                                  str(tmp / "out"), "--workers", str(args.workers)], tmp / "corpus.log", args.every,
                        args.timeout)
        if r["rc"] != 0:
            print(r["output"][-3000:])
            print(f"FAILED: codechat data corpus exited with {r['rc']}")
            return 1
        index = json.loads((tmp / "out" / "index.json").read_text())
        tokens = sum(index["splits"][s]["tokens"] for s in ("train", "val"))
        taken = sum(index["splits"][s]["bytes"] for s in ("train", "val"))
        print(f"corpus: {r['seconds']:.0f} s, {taken / MiB / r['seconds']:.2f} MiB/s of text, {tokens} tokens, "
              f"{index['records_read']} records, skipped {index['skipped']}, {args.workers} workers, "
              f"{os.cpu_count()} CPU cores")
        mib = 1024  # KiB per MiB
        command = [v for p, v in r["hwm"].items() if r["names"][p] == "command"]
        workers = sorted((v for p, v in r["hwm"].items() if r["names"][p] == "worker"), reverse=True)
        tracker = [v for p, v in r["hwm"].items() if r["names"][p] == "tracker"]
        print(f"peak RSS, command process: {max(command) / mib:.0f} MiB")
        print(f"peak RSS per worker: {', '.join(f'{v / mib:.0f}' for v in workers)} MiB ({len(workers)} processes)")
        print(f"sum of the workers' peaks: {sum(workers) / mib:.0f} MiB")
        print(f"peak RSS, multiprocessing resource tracker: {sum(tracker) / mib:.0f} MiB")
        total = sum(command) + sum(workers) + sum(tracker)
        print(f"sum of all peaks (command + workers + tracker): {total / mib:.0f} MiB")
        print(f"largest sampled simultaneous tree RSS: {r['peak_rss'] / mib:.0f} MiB, PSS: {r['peak_pss'] / mib:.0f} MiB")
        print(f"wait4 ru_maxrss (kernel: largest single process of the tree): {r['tree_maxrss'] / mib:.0f} MiB")
        ok = total < args.limit_gb * GiB / 1024
        print(f"verdict: {'PASS' if ok else 'FAIL'}: {total / mib:.0f} MiB summed peaks "
              f"{'<' if ok else '>='} {args.limit_gb * 1024:.0f} MiB for a {data.stat().st_size / GiB:.2f} GiB input")
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
