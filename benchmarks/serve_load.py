"""Load on ``codechat serve``: requests/s, tokens/s, p50/p99 latency and time to first token for 1,
16 and 64 concurrent clients, streaming and not, against the engine alone on the same work.

Starts ``python -m codechat serve`` on a free port of 127.0.0.1 over ``--model`` or, by default, a
``--preset`` with random weights (seeded) saved with a tokenizer of ``--vocab-size`` ids trained
on this Python's standard library (cached in ``--work``). Random weights get their control ids'
logits set to 0 (below the best of thousands of random logits), so no greedy reply stops early and
every request generates exactly ``--new-tokens`` tokens. Each of C clients (the official
``openai.AsyncOpenAI``; streaming with ``include_usage``, or not) sends ``--requests`` chat requests
one after another: a user turn of ``--prompt-chars`` characters of stdlib source (a different slice
per request), greedy, ``max_tokens`` = ``--new-tokens``. The C clients are spread over
``--client-procs`` spawned processes (each an event loop of its share), so that parsing the
server's JSON in the client is not what limits the rate; their CPU use is reported. The server
runs on ``--server-cores`` of this process's cores and the client processes on the others
(``sched_setaffinity``, as ``taskset`` would; Linux), so neither takes the other's cores; the
split is printed and kept in ``--out`` (``server_cores``, ``client_cores``).

    PYTHONPATH=. python benchmarks/serve_load.py --preset d20 --device cuda [--out $OUT/serve.json]
    PYTHONPATH=. python benchmarks/serve_load.py --preset tiny --vocab-size 2048 --device cpu --quick

Before the timed rounds, warm-up rounds (streaming, 2 requests a client) run at every concurrency,
the largest first: the server captures its CUDA graphs and compiles on first use, and a batch size or
prefill length first met in a timed round costs it seconds there (a fresh H100 measured 0.38x after a
warm-up round of one request a client at 64 clients only, whose requests all started and ended
together: ``benchmarks/RESULTS.md``, twelfth session). Then, per mode and concurrency C, one line per
figure, ``serve_c{C}_*`` streaming and ``serve_whole_c{C}_*`` not:

- ``requests_s``: requests finished / the round's wall seconds (first send to last answer);
- ``tokens_s``: completion tokens (from each answer's ``usage``) / the same seconds;
- ``latency_p50_s`` / ``_p99_s``: one request, send to its last byte;
- ``ttft_p50_ms`` / ``_p99_ms`` (streaming): send to the first content chunk;
- ``errors``: requests that failed (a figure above 0 makes the others suspect);
- ``server_cpu``: the server's CPU seconds (every thread, the engine process's too) / wall seconds, in cores;
  ``front_end_us_token``: the server process's own CPU microseconds per completion token (with
  ``--engine process`` the HTTP front end alone: its cost per token whatever the engine's speed);
  ``client_cpu``: the client processes' together, and ``client_cpu_max`` the busiest one's (near 1
  means a client process was saturated: raise ``--client-procs``);
- ``client_ramp`` / ``_wait`` / ``_stream`` / ``_gap`` / ``_tail``: where the clients' time went
  (:func:`client_shares`; they add up to 1): before a client's first send, waiting for the first
  content (the whole request when not streaming), streaming, between one answer and the next send,
  after its last answer; ``1 - wait - stream`` of the batch is idle from the clients' side;
- the engine's step timeline over the round (two snapshots of ``/health``'s ``engine`` counters):
  ``busy`` (seconds inside ``Engine.step`` / wall) and ``idle`` (the engine thread waiting for work
  / wall), ``steps``, ``rows_per_launch`` (the mean decode batch), ``prefills`` and
  ``rows_per_prefill``, and per step the milliseconds in it (``step_ms``), blocked on the device
  (``wait_ms_step``), admitting rows (``admit_ms_step``: the prefill's host work), the rest of the
  host work (``host_ms_step``) and handing tokens to the event loop (``deliver_ms_step``);
- ``engine_c{C}_tokens_s``: the baseline, measured after the server stopped: the same C prompts as
  one :meth:`codechat.engine.Engine.generate` call in this process, ``--requests`` times, same
  engine settings, on the server's cores, with its timeline as ``engine_c{C}_*``; ``*_vs_engine``:
  the serve tokens/s over it (HTTP, JSON, SSE and the requests' staggered arrivals cost the
  difference; the two timelines say which);
- ``engine_c{C}_loop_*``: the engine alone under the server's arrival pattern (``serve_engine.closed_loop``:
  each of C clients' ``--requests`` requests added in the step its last one finished), with its
  timeline; ``*_vs_engine_loop``: serve over it. The one-batch baseline over the loop prices the
  admissions of joining rows; the loop over serve, the HTTP front end and the clients' turnaround.

``--http`` and ``--loop`` choose the server's HTTP parser and event loop (``codechat serve --http
httptools --loop uvloop``, where those are installed, against h11 and asyncio).

``--py-spy`` samples the server (the engine process too) with ``py-spy record --threads --gil
--subprocesses --nonblocking`` (on PATH or beside this Python) during the rounds at the largest
concurrency and prints each thread's share of the GIL and the top stacks (where one process's GIL is
the limit, the engine thread's share falls as the event loop's grows); ``--py-spy wall`` samples idle
and waiting threads too (``--idle`` for ``--gil``): where each thread's wall time goes, a wait on the
device or a queue included (:mod:`py_spy_profile`). Not pausing the server, py-spy
can misplace samples: on the CPU it put 65% of the front end in h11's header parser, which takes
~42 us a request when timed alone; read its stacks as hints. ``--out``
writes every figure, the profiles and the settings as JSON. ``--trace FILE`` profiles the closed loop
at the largest concurrency with torch's profiler (the device's busy share, the top operations, a
Chrome trace): where the engine's step loses time to the host under the server's arrivals.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch

from codechat import checkpoint as ckpt
from codechat.config.stages import default_corpus_dirs, preset, to_dict
from codechat.data.sources import iter_split_texts
from codechat.model import build_model
from codechat.tokenizer import Tokenizer, train_tokenizer
from py_spy_profile import SAMPLES, print_profile, py_spy_exe, read_profile, start_py_spy, stop_py_spy
from serve_engine import engine_baseline, timeline

TOKENIZER_BYTES = 30_000_000  # stdlib text the cached tokenizer is trained on


def random_checkpoint(name: str, vocab: int, work: Path, seed: int) -> Path:
    """A checkpoint of preset ``name`` with random weights that never pick a control id greedily."""
    tok_dir = work / f"tokenizer-{vocab}"
    if not (tok_dir / "codechat_tokenizer.json").is_file():
        print(f"# training a {vocab}-id tokenizer on the stdlib into {tok_dir}", flush=True)
        texts = iter_split_texts(default_corpus_dirs(), "train", max_bytes=TOKENIZER_BYTES)
        train_tokenizer(texts, vocab, show_progress=False).save(tok_dir)
    tok = Tokenizer.load(tok_dir)
    torch.manual_seed(seed)
    model = build_model(preset(name, vocab_size=tok.vocab_size))
    with torch.no_grad():
        model.lm_head.weight[sorted(tok.special_ids)] = 0.0
    out = work / f"{name}-v{tok.vocab_size}-s{seed}"
    if not out.is_dir():
        ckpt.save(out / "checkpoints", 0, model=model.state_dict(),
                  state={"step": 0, "meta": {"stage": "random", "model": to_dict(model.cfg)}}, tokenizer_dir=tok_dir)
    return out


def prompts(count: int, chars: int) -> list[str]:
    """``count`` user messages: consecutive slices of stdlib source, ``chars`` characters each."""
    text = "".join(iter_split_texts(default_corpus_dirs(), "train", max_bytes=count * chars + 10_000))
    return [f"Explain this code:\n{text[i * chars:(i + 1) * chars]}" for i in range(count)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def core_split(server_cores: int) -> tuple[list[int], list[int]]:
    """``(server's cores, clients' cores)``: the first ``server_cores`` of this process's allowed
    cores and the rest; two empty lists where the platform cannot pin processes (not Linux) or too
    few cores are left for the clients (nothing pinned then)."""
    if not hasattr(os, "sched_setaffinity"):
        return [], []
    cores = sorted(os.sched_getaffinity(0))
    if not 1 <= server_cores < len(cores):
        return [], []
    return cores[:server_cores], cores[server_cores:]


def _ranges(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out, start = [], None
    for i, c in enumerate(cores):
        start = c if start is None else start
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            out.append(f"{start}-{c}" if c > start else f"{c}")
            start = None
    return ",".join(out) or "all (not pinned)"


def start_server(model: Path, args: argparse.Namespace, log: Path, cores: list[int]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "codechat", "serve", "--model", str(model), "--port", str(port),
           "--device", args.device, "--slots", str(args.slots), "--queue-size", str(4 * max(args.concurrency)),
           "--log-level", "warning", "--engine", args.engine, "--http", args.http, "--loop", args.loop]
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, preexec_fn=pin)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("the server did not answer /health within 600 s")


async def _client_requests(api, texts: list[list[str]], new: int, stream: bool) -> dict:
    """One process's clients: client ``k`` sends ``texts[k]`` one after another (``api``, an official
    ``openai.AsyncOpenAI``; greedy, ``max_tokens`` = ``new``); its tokens, errors, and each client's
    requests as ``(send, first content, end)`` times (``time.monotonic``; the end when no content came)."""
    import openai
    out: dict = {"tokens": 0, "errors": 0, "times": []}

    async def one(text: str, times: list) -> None:
        sent, first = time.monotonic(), None
        kw = dict(model="codechat", messages=[{"role": "user", "content": text}], max_tokens=new, temperature=0)
        if stream:
            resp = await api.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
            async for chunk in resp:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic()
                if chunk.usage is not None:
                    out["tokens"] += chunk.usage.completion_tokens
        else:
            resp = await api.chat.completions.create(**kw)  # awaited before the sum is read: others add meanwhile
            out["tokens"] += resp.usage.completion_tokens
        end = time.monotonic()
        times.append((sent, first or end, end))

    async def client(mine: list[str]) -> None:
        times: list[tuple[float, float, float]] = []
        out["times"].append(times)
        for text in mine:
            try:
                await one(text, times)
            except openai.APIError as e:
                out["errors"] += 1
                print(f"# request failed: {e}", file=sys.stderr)

    await asyncio.gather(*(client(mine) for mine in texts))
    await api.close()
    return out


def _client_process(url: str, texts: list[list[str]], new: int, stream: bool, start, results,
                    cores: list[int]) -> None:
    """A client process (spawned, pinned to ``cores`` when given): says it is ready on ``results``,
    waits for ``start``, runs its clients, puts its figures, its CPU seconds and its start / finish
    times (CLOCK_MONOTONIC, which every process of the machine shares, as the requests' times are)
    on ``results``. Its openai client is built before it says it is ready."""
    if cores:
        os.sched_setaffinity(0, cores)
    import openai  # imported and built before the start: not timed
    api = openai.AsyncOpenAI(api_key="none", base_url=url + "/v1", max_retries=0, timeout=3600)
    api.chat.completions  # noqa: B018  (openai imports it on first use: 0.2 s on a CPU, in the first request's time)
    results.put("ready")
    start.wait()
    cpu0, t0 = time.process_time(), time.monotonic()
    out = asyncio.run(_client_requests(api, texts, new, stream))
    results.put({**out, "cpu_s": time.process_time() - cpu0, "t0": t0, "t1": time.monotonic()})


def client_shares(clients: list[list[tuple[float, float, float]]], t0: float, t1: float) -> dict[str, float]:
    """Where the clients' time went over a round from ``t0`` to ``t1``: each client's requests as
    ``(send, first content, end)`` times, in order, its time split into ``ramp`` (before its first
    send), ``wait`` (send to first content: the whole request when not streaming), ``stream`` (first
    content to end), ``gap`` (an end to the next send: the client's own turnaround) and ``tail`` (its
    last end to the round's), each summed over the clients over ``len(clients) * (t1 - t0)``; the five
    add up to 1. ``wait + stream`` is the share of the round the clients had a request in flight;
    with one row a request, the rest is batch the engine could not fill."""
    span = max(len(clients) * (t1 - t0), 1e-9)
    out = dict.fromkeys(("ramp", "wait", "stream", "gap", "tail"), 0.0)
    for reqs in clients:
        if not reqs:
            out["ramp"] += t1 - t0
            continue
        out["ramp"] += reqs[0][0] - t0
        out["tail"] += t1 - reqs[-1][2]
        for i, (sent, first, end) in enumerate(reqs):
            out["wait"] += first - sent
            out["stream"] += end - first
            if i:
                out["gap"] += sent - reqs[i - 1][2]
    return {f"client_{k}": v / span for k, v in out.items()}


def _cpu_s(pid: int, children: bool = True) -> float:
    """User + system CPU seconds so far of process ``pid`` and, with ``children``, of its children
    (the engine process of ``--engine process``; Linux ``/proc``; NaN elsewhere)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split() if children else []
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(_cpu_s(int(c)) for c in kids)
    except (OSError, ValueError, IndexError):
        return float("nan")


def one_round(url: str, messages: list[str], clients: int, per_client: int, new: int, stream: bool, procs: int,
              server_pid: int, cores: list[int] = (), py_spy: Path | None = None, spy_samples: str = "gil") -> dict:
    """``clients`` concurrent clients, ``per_client`` requests each, spread over ``procs`` client
    processes on ``cores`` (so that the clients' own JSON and SSE parsing is not what limits the
    rate); the round's figures (module docstring), timed from the first send to the last answer.
    With ``py_spy``, the server is sampled during the round into that file (:func:`start_py_spy`, its
    ``spy_samples``)."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    procs = max(1, min(procs, clients))
    texts = [[messages[(k * per_client + r) % len(messages)] for r in range(per_client)] for k in range(clients)]
    start, results = ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=_client_process, args=(url, texts[i::procs], new, stream, start, results,
                                                         list(cores)))
               for i in range(procs)]
    for w in workers:
        w.start()

    def collect(n: int, what: str) -> list:
        """``n`` items of ``results``; stops the run as soon as a client process died instead."""
        got = []
        while len(got) < n:
            try:
                got.append(results.get(timeout=1))
            except queue.Empty:
                dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
                if dead:
                    for w in workers:
                        w.kill()
                    sys.exit(f"a client process exited with {dead[0]} {what}")
        return got
    collect(procs, "before the round started")
    server0, front0, (engine0, e0) = _cpu_s(server_pid), _cpu_s(server_pid, False), _engine_counters(url)
    spy = start_py_spy(server_pid, py_spy, spy_samples) if py_spy else None
    start.set()
    parts = collect(procs, "during the round")
    server_cpu, front_cpu = _cpu_s(server_pid) - server0, _cpu_s(server_pid, False) - front0
    if spy is not None:
        stop_py_spy(spy)
    engine1, e1 = _engine_counters(url)
    for w in workers:
        w.join()
    clients_times = [c for p in parts for c in p["times"]]
    t0 = min([c[0][0] for c in clients_times if c] or [p["t0"] for p in parts])  # the first send
    t1 = max([c[-1][2] for c in clients_times if c] or [p["t1"] for p in parts])  # the last answer
    wall = t1 - t0
    latencies = [end - sent for c in clients_times for sent, _, end in c]
    ttfts = [first - sent for c in clients_times for sent, first, _ in c]
    pct = (lambda xs, q: float(np.percentile(xs, q)) if xs else float("nan"))
    figures = {"requests_s": len(latencies) / wall, "tokens_s": sum(p["tokens"] for p in parts) / wall,
               "latency_p50_s": pct(latencies, 50), "latency_p99_s": pct(latencies, 99)}
    if stream:
        figures |= {"ttft_p50_ms": 1e3 * pct(ttfts, 50), "ttft_p99_ms": 1e3 * pct(ttfts, 99)}
    tokens = sum(p["tokens"] for p in parts)
    return figures | {"errors": sum(p["errors"] for p in parts), "server_cpu": server_cpu / wall,
                      "front_end_us_token": 1e6 * front_cpu / max(tokens, 1),
                      "client_cpu": sum(p["cpu_s"] for p in parts) / wall,
                      "client_cpu_max": max(p["cpu_s"] for p in parts) / wall} \
        | client_shares(clients_times, t0, t1) | timeline(engine0, engine1, e1 - e0) \
        | ({"py_spy": read_profile(py_spy, wall)} if spy is not None and py_spy.is_file() else {})


def _engine_counters(url: str) -> tuple[dict[str, float], float]:
    """The server's engine step counters so far (``/health``'s ``engine``) and when they were read
    (``time.perf_counter``)."""
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        return json.load(r)["engine"], time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="d20", help="preset of the random-weights model (default d20)")
    ap.add_argument("--model", help="serve this checkpoint or stage directory instead of random weights")
    ap.add_argument("--vocab-size", type=int, default=32768, help="the random model's tokenizer size (default 32768)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--slots", type=int, default=0, help="engine slots, server and baseline (default 0: automatic)")
    ap.add_argument("--concurrency", default="1,16,64", help="concurrent clients per round (default 1,16,64)")
    ap.add_argument("--requests", type=int, default=4, help="requests each client sends in a round (default 4)")
    ap.add_argument("--new-tokens", type=int, default=256, help="max_tokens of each request (default 256)")
    ap.add_argument("--prompt-chars", type=int, default=1000, help="characters of each user turn (default 1000)")
    ap.add_argument("--modes", default="stream,whole",
                    help="rounds to run: stream (SSE), whole (non-streaming), or both (default stream,whole)")
    ap.add_argument("--client-procs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="client processes the clients of a round are spread over (default: half the CPUs)")
    ap.add_argument("--server-cores", type=int, default=0,
                    help="cores the server is pinned to, the client processes getting the others (default 0: "
                         "the CPUs less --client-procs; nothing is pinned when no core would be left)")
    ap.add_argument("--quick", action="store_true", help="CPU smoke check: 1 request a client, 16 new tokens, "
                                                         "300-character prompts")
    ap.add_argument("--engine", choices=["process", "thread"], default="process",
                    help="where the server runs its engine (codechat serve --engine; default process)")
    ap.add_argument("--http", default="auto", help="the server's HTTP parser (codechat serve --http; default auto)")
    ap.add_argument("--loop", default="auto", help="the server's event loop (codechat serve --loop; default auto)")
    ap.add_argument("--py-spy", nargs="?", const="gil", choices=SAMPLES,
                    help="sample the server with py-spy (on PATH) during the rounds at the largest concurrency: "
                         "each thread's share of the GIL (gil, the default) or of its wall time, idle and "
                         "waiting included (wall), and the top stacks (files in --work)")
    ap.add_argument("--trace", metavar="FILE",
                    help="after the baselines, run the closed loop at the largest concurrency once more under "
                         "torch's profiler: its top operations, the device's busy share, a Chrome trace in FILE")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "codechat-serve-load"),
                    help="where the tokenizer and random checkpoint are cached")
    ap.add_argument("--out", help="write the figures and settings as JSON here")
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.modes = args.modes.split(",")
    if not args.modes or set(args.modes) - {"stream", "whole"}:
        ap.error(f"--modes takes stream, whole or both, comma-separated; got {','.join(args.modes)!r}")
    if args.client_procs < 1:
        ap.error(f"--client-procs must be >= 1, got {args.client_procs}")
    if args.py_spy and py_spy_exe() is None:
        ap.error("--py-spy: py-spy is not installed here (pip install py-spy)")
    if args.quick:
        args.requests, args.new_tokens, args.prompt_chars = 1, 16, 300
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = Path(args.model) if args.model else random_checkpoint(args.preset, args.vocab_size, work, args.seed)
    import openai
    print(f"# serve_load: {model_dir} on {args.device}, torch {torch.__version__}, openai {openai.__version__}; "
          f"concurrency {args.concurrency}, {args.requests} requests a client, {args.new_tokens} new tokens, "
          f"{args.prompt_chars}-character prompts, modes {args.modes}, clients over {args.client_procs} processes, "
          f"the server's engine in a {args.engine}, its HTTP parser {args.http}, its event loop {args.loop}",
          flush=True)
    messages = prompts(max(args.concurrency) * args.requests, args.prompt_chars)
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    server_cores, client_cores = core_split(args.server_cores or allowed - args.client_procs)
    print(f"# cores: server {_ranges(server_cores)}, clients {_ranges(client_cores)}", flush=True)
    proc, url = start_server(model_dir, args, work / "server.log", server_cores)
    figures: dict[str, float] = {}
    profiles: dict[str, dict] = {}
    rounds = [(mode, c) for mode in args.modes for c in args.concurrency]
    try:
        for c in sorted(args.concurrency, reverse=True):  # warm-up: staggered arrivals meet every batch size
            one_round(url, messages, c, 2, args.new_tokens, True, args.client_procs, proc.pid, client_cores)
        for mode, c in rounds:
            stream = mode == "stream"
            name = f"serve_c{c}" if stream else f"serve_whole_c{c}"
            spy = work / f"py-spy-{name}.txt" if args.py_spy and c == max(args.concurrency) else None
            got = one_round(url, messages, c, args.requests, args.new_tokens, stream, args.client_procs, proc.pid,
                            client_cores, spy, args.py_spy or "gil")
            if "py_spy" in got:
                profiles[name] = got.pop("py_spy")
                print_profile(name, profiles[name], spy, args.py_spy)
            for k, v in got.items():
                figures[f"{name}_{k}"] = v
                print(f"{name}_{k} {v:.4g}", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    for c, base in engine_baseline(model_dir, messages, args, server_cores).items():
        for k, v in base.items():
            figures[f"engine_c{c}_{k}"] = v
            print(f"engine_c{c}_{k} {v:.4g}")
        for name in (f"serve_c{c}", f"serve_whole_c{c}"):
            if f"{name}_tokens_s" in figures:
                figures[f"{name}_vs_engine"] = figures[f"{name}_tokens_s"] / base["tokens_s"]
                figures[f"{name}_vs_engine_loop"] = figures[f"{name}_tokens_s"] / base["loop_tokens_s"]
                print(f"{name}_vs_engine {figures[f'{name}_vs_engine']:.3f} (against the closed loop "
                      f"{figures[f'{name}_vs_engine_loop']:.3f})")
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": {k: v for k, v in vars(args).items()},
                                              "model": str(model_dir), "server_cores": server_cores,
                                              "client_cores": client_cores, "figures": figures,
                                              "py_spy": profiles}, indent=2))


if __name__ == "__main__":
    main()
