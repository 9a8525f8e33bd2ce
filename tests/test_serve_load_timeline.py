"""``benchmarks/serve_load.py``'s readings (and ``serve_engine.py``'s) of the engine's step counters, of
the clients' request times and of a py-spy profile: the figures a GPU session acts on, checked on made-up
inputs whose answers are known."""
from __future__ import annotations

import pytest
from conftest import benchmark_module


@pytest.fixture(scope="module")
def serve_load():
    with benchmark_module("serve_load") as module:
        yield module


@pytest.fixture(scope="module")
def serve_engine():
    with benchmark_module("serve_engine") as module:
        yield module


@pytest.fixture(scope="module")
def spy():
    with benchmark_module("py_spy_profile") as module:
        yield module


def counters(**kw) -> dict[str, float]:
    base = dict(steps=0, step_s=0.0, launches=0, masked_launches=0, launch_rows=0, wait_s=0.0, fill_s=0.0,
                prefills=0, prefill_rows=0, prefill_tokens=0, admit_s=0.0, tokens=0, idle_s=0.0, deliver_s=0.0)
    return base | kw


def test_timeline_is_the_difference_of_two_snapshots_per_step_and_per_second(serve_engine):
    before = counters(steps=10, step_s=1.0, launches=10, launch_rows=100, prefills=2, prefill_rows=8, idle_s=5.0)
    after = counters(steps=110, step_s=3.0, launches=100, launch_rows=100 + 90 * 32, wait_s=1.0, prefills=6,
                     prefill_rows=8 + 64, admit_s=0.5, idle_s=6.0, deliver_s=0.2)
    t = serve_engine.timeline(before, after, wall=4.0)
    assert t["busy"] == pytest.approx(0.5) and t["idle"] == pytest.approx(0.25)
    assert t["steps"] == 100 and t["rows_per_launch"] == pytest.approx(32.0)
    assert t["prefills"] == 4 and t["rows_per_prefill"] == pytest.approx(16.0)
    assert t["step_ms"] == pytest.approx(20.0) and t["wait_ms_step"] == pytest.approx(10.0)
    assert t["admit_ms_step"] == pytest.approx(5.0) and t["host_ms_step"] == pytest.approx(5.0)
    assert t["deliver_ms_step"] == pytest.approx(2.0)
    engine_alone = {k: v for k, v in after.items() if k not in ("idle_s", "deliver_s")}
    assert "idle" not in serve_engine.timeline(engine_alone, engine_alone, wall=1.0)  # no thread around it


def test_client_shares_split_each_clients_round_into_ramp_wait_stream_gap_and_tail(serve_load):
    # round 0..10 s, two clients: A sends at 1, first content at 2, ends at 5, sends again at 6, first at 6.5,
    # ends at 9; B never got a request through (its whole round is ramp)
    a = [(1.0, 2.0, 5.0), (6.0, 6.5, 9.0)]
    s = serve_load.client_shares([a, []], 0.0, 10.0)
    assert s == pytest.approx({"client_ramp": (1 + 10) / 20, "client_wait": 1.5 / 20, "client_stream": 5.5 / 20,
                               "client_gap": 1 / 20, "client_tail": 1 / 20})
    assert sum(s.values()) == pytest.approx(1.0)


def test_the_profile_gives_each_threads_share_of_the_round_and_the_top_stacks(spy, tmp_path):
    raw = tmp_path / "spy.txt"
    wall = 1000 / spy.PY_SPY_RATE  # 1000 samples' worth
    raw.write_text(
        "thread (11): MainThread;run (a.py:1);loop (b.py:2);send (c.py:3) 250\n"
        "thread (12): codechat-engine;run (a.py:1);step (s.py:9);drain (s.py:10) 100\n"
        "thread (11): MainThread;run (a.py:1);loop (b.py:2);encode (j.py:4) 150\n")
    p = spy.read_profile(raw, wall)
    assert p["share"] == {"MainThread": pytest.approx(0.4), "codechat-engine": pytest.approx(0.1)}
    assert list(p["share"]) == ["MainThread", "codechat-engine"]  # the largest first
    assert p["top"][0] == {"thread": "MainThread", "stack": "send < loop < run", "share": pytest.approx(0.25)}
    assert {r["stack"] for r in p["top"]} == {"send < loop < run", "drain < step < run", "encode < loop < run"}


def test_the_profile_names_each_thread_after_its_process_with_subprocesses(spy, tmp_path):
    raw = tmp_path / "spy.txt"
    front = 'process 7:"python -m codechat serve --engine process";'
    engine = 'process 9:"python -c from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=8)";'
    raw.write_text(f"{front}thread (7): MainThread;loop (b.py:2);send (c.py:3) 300\n"
                   f"{front}{engine}thread (9): MainThread;run (w.py:1);step (s.py:9) 200\n")
    p = spy.read_profile(raw, 1000 / spy.PY_SPY_RATE)
    assert p["share"] == {"server MainThread": pytest.approx(0.3), "engine process MainThread": pytest.approx(0.2)}
    assert p["top"][1]["stack"] == "step < run"


def test_the_profile_leaves_helper_processes_out_and_gives_a_pools_mean_thread(spy, tmp_path):
    """The eighteenth session's wall profile (H100, 2026-12-06) read Inductor's compile workers as the
    server and summed forty AnyIO workers into one thread at 1,533%: neither may happen."""
    raw = tmp_path / "spy.txt"
    front = 'process 7:"python -m codechat serve";'
    engine = 'process 9:"python -c from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=8)";'
    compile_worker = 'process 12:"python -m torch._inductor.compile_worker";'
    forked = 'process 13:"python -m codechat serve";'
    raw.write_text(f"{front}thread (20): AnyIO worker thread;run (w.py:1);get (q.py:2);wait (t.py:3) 900\n"
                   f"{front}thread (21): AnyIO worker thread;run (w.py:1);get (q.py:2);wait (t.py:3) 700\n"
                   f"{front}thread (21): AnyIO worker thread;run (w.py:1);encode (j.py:4) 100\n"
                   f"{front}{engine}thread (9): MainThread;run (w.py:1);step (s.py:9);sync (e.py:5) 600\n"
                   f"{front}{engine}thread (9): MainThread;run (w.py:1);step (s.py:9);admit (s.py:7) 300\n"
                   f"{front}{engine}thread (9): MainThread;run (w.py:1);step (s.py:9);tiny (s.py:8) 10\n"
                   f"{front}{engine}{compile_worker}thread (12): MainThread;main (c.py:1);recv (c.py:2) 1000\n"
                   f"{front}{forked}thread (13): MainThread;_process_worker (p.py:1);get (q.py:2) 1000\n")
    p = spy.read_profile(raw, 1000 / spy.PY_SPY_RATE)
    assert p["helpers"] == 2  # the compile worker and the server's forked pool worker
    assert p["share"] == {"engine process MainThread": pytest.approx(0.91),
                          "server AnyIO worker thread x2": pytest.approx(0.85)}
    assert [(r["thread"], r["stack"], round(r["share"], 3)) for r in p["top"]] == [
        ("engine process MainThread", "sync < step < run", 0.6),
        ("engine process MainThread", "admit < step < run", 0.3),  # 'tiny' is under 2% of the round
        ("server AnyIO worker thread x2", "wait < get < run", 0.8),
        ("server AnyIO worker thread x2", "encode < run", 0.05)]


def test_the_closed_loop_sends_each_clients_next_request_when_its_last_finished(serve_engine):
    """Every request runs once, a client's one after another: with 3 clients, 3 rows at most at a time."""
    import torch
    from codechat.config.stages import preset
    from codechat.engine import Engine, EngineConfig, Request, SamplingConfig
    from codechat.model import build_model
    torch.manual_seed(0)
    engine = Engine(build_model(preset("tiny", vocab_size=256, max_seq_len=64)).eval(), EngineConfig(slots=8))
    cfg = SamplingConfig(5, 0.0, 0, 1.0)
    clients = [[Request([1 + k, 2 + r, 3], cfg) for r in range(4)] for k in range(3)]
    most, step = 0, engine.step

    def counted() -> list:
        nonlocal most
        out = step()
        most = max(most, engine.busy()[0] + engine.busy()[1])
        return out
    engine.step = counted
    assert serve_engine.closed_loop(engine, clients) == 3 * 4 * 5  # every request's 5 tokens (no stop ids)
    assert most <= 3 and engine.counters.prefills >= 4 and not engine.has_work()


def test_py_spy_samples_the_gil_or_the_wall_time_of_the_server_and_its_children(spy, monkeypatch, tmp_path):
    cmds = []
    monkeypatch.setattr(spy.subprocess, "Popen", lambda cmd, **kw: cmds.append(cmd))
    spy.start_py_spy(42, tmp_path / "a.txt")
    spy.start_py_spy(42, tmp_path / "b.txt", "wall")
    gil, wall = cmds
    assert "--gil" in gil and "--idle" not in gil and "--idle" in wall and "--gil" not in wall
    assert all({"--subprocesses", "--threads", "--nonblocking"} <= set(c) and c[c.index("--pid") + 1] == "42"
               for c in cmds)
    with pytest.raises(ValueError, match="gil, wall"):
        spy.start_py_spy(42, tmp_path / "c.txt", "cpu")
