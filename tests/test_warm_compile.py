"""The compile warm-ups of pretraining and chat SFT (``codechat.train.pretrain.warm_compile``,
``codechat.train.sft.warm_compile``): compiled in one process on random tokens, the same config's
stage in another process loads every graph from torch's on-disk caches instead of compiling it; and
the speedrun's start of them and wait for them (``BackgroundJobs``)."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from concurrent.futures import Future
from dataclasses import replace

import pytest
import torch

from codechat.config.yaml_io import ConfigError

# one process: ``warm`` compiles the config, ``train`` pretrains it for 2 steps; each prints its
# first step's seconds and torch's cache counters as JSON
SCRIPT = """
import json, sys
from torch._dynamo.utils import counters
from codechat.config.stages import PretrainConfig, RunConfig, load, replace
from codechat.train.pretrain import run_pretrain, warm_compile
what, tok_dir, data_dir, out, vocab = sys.argv[1:]
over = {"model.n_layer": 2, "model.n_embd": 64, "model.n_head": 2, "model.n_kv_head": 1, "data.seq_len": 64,
        "train.micro_batch_size": 4, "train.eval_tokens": 512, "train.compile": True, "train.max_steps": 2,
        "data.data_dir": data_dir, "data.tokenizer_dir": tok_dir}
cfg = replace(load(PretrainConfig, None, over), run=RunConfig(out=out, device="cpu"))
first = warm_compile(cfg, int(vocab)) if what == "warm" else run_pretrain(cfg, show_progress=False)["first_step_s"]
print(json.dumps({"first_step_s": first, "inductor": dict(counters["inductor"]),
                  "aot_autograd": dict(counters["aot_autograd"])}))
"""


def run(what: str, tok_dir, corpus_dir, out, vocab: int, cache) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", SCRIPT, what, str(tok_dir), str(corpus_dir), str(out), str(vocab)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_warmed_up_config_trains_on_graphs_loaded_from_the_caches(tmp_path, tok, tok_dir, corpus_dir):
    cache = tmp_path / "inductor"  # cold: a cache of this test's own
    warm = run("warm", tok_dir, corpus_dir, tmp_path / "warm", tok.vocab_size, cache)
    assert warm["inductor"]["fxgraph_cache_miss"] >= 2 and not warm["inductor"].get("fxgraph_cache_hit")
    assert not (tmp_path / "warm").exists()  # nothing written but the caches
    got = run("train", tok_dir, corpus_dir, tmp_path / "train", tok.vocab_size, cache)
    # the forward and backward graphs, each loaded: none compiled again
    assert got["inductor"]["fxgraph_cache_hit"] == warm["inductor"]["fxgraph_cache_miss"]
    assert not got["inductor"].get("fxgraph_cache_miss") and got["aot_autograd"].get("autograd_cache_hit") == 1
    assert (tmp_path / "train" / "metrics.jsonl").is_file()


def test_warm_compile_refuses_an_eager_config_and_torchrun(monkeypatch):
    from codechat.config.stages import PretrainConfig, load
    from codechat.train.pretrain import warm_compile
    with pytest.raises(ConfigError, match="train.compile is off"):
        warm_compile(load(PretrainConfig, None, {"train.compile": False}), 256)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="not under torchrun"):
        warm_compile(load(PretrainConfig, None, {"train.compile": True}), 256)


# chat SFT's: ``pretrain`` writes an eager 2-layer checkpoint (no graphs), ``warm`` compiles SFT's graphs
# for its shape, ``sft`` runs 2 compiled SFT steps from it; each prints torch's cache counters as JSON
SFT_SCRIPT = """
import json, sys
from torch._dynamo.utils import counters
from codechat.config.sft import SFTConfig, SFTStageConfig
from codechat.config.stages import PretrainConfig, RunConfig, TrainConfig, load, replace
from codechat.train.pretrain import run_pretrain
from codechat.train.sft import run_sft, warm_compile
what, tok_dir, data_dir, out, vocab, data = sys.argv[1:]
over = {"model.n_layer": 2, "model.n_embd": 64, "model.n_head": 2, "model.n_kv_head": 1, "model.max_seq_len": 64,
        "data.seq_len": 64, "train.micro_batch_size": 2, "train.eval_tokens": 256, "train.max_steps": 1,
        "data.data_dir": data_dir, "data.tokenizer_dir": tok_dir}
pre = replace(load(PretrainConfig, None, over), run=RunConfig(out=out + "/pretrain", device="cpu"))
sft = SFTStageConfig(init=out + "/pretrain", sft=SFTConfig(data=data, packing=True, decontaminate=False, max_length=64,
                                                           max_prompt_length=32),
                     train=TrainConfig(micro_batch_size=2, max_steps=2, eval_every=10**9, save_every=10**9, compile=True),
                     run=RunConfig(out=out + "/sft", device="cpu"))
if what == "pretrain":
    run_pretrain(pre, show_progress=False)
elif what == "warm":
    warm_compile(sft, replace(pre.model, vocab_size=int(vocab)))
else:
    run_sft(sft, show_progress=False)
print(json.dumps({"inductor": dict(counters["inductor"]), "aot_autograd": dict(counters["aot_autograd"])}))
"""


def test_a_warmed_up_sft_config_trains_on_graphs_loaded_from_the_caches(tmp_path, tok, tok_dir, corpus_dir):
    cache = tmp_path / "inductor"
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"def f{i}(x):", "completion": f"    return x + {i} * x" * (1 + i % 3)})
                            + "\n" for i in range(40)))

    def run_sft_script(what: str) -> dict:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
        p = subprocess.run([sys.executable, "-c", SFT_SCRIPT, what, str(tok_dir), str(corpus_dir), str(tmp_path),
                            str(tok.vocab_size), str(data)], capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    run_sft_script("pretrain")
    warm = run_sft_script("warm")
    assert warm["inductor"]["fxgraph_cache_miss"] >= 2 and not warm["inductor"].get("fxgraph_cache_hit")
    got = run_sft_script("sft")  # every graph loaded, none compiled again
    assert got["inductor"]["fxgraph_cache_hit"] == warm["inductor"]["fxgraph_cache_miss"]
    assert not got["inductor"].get("fxgraph_cache_miss")
    assert got["aot_autograd"]["autograd_cache_hit"] == warm["aot_autograd"]["autograd_cache_miss"] >= 1
    assert (tmp_path / "sft" / "metrics.jsonl").is_file()


def test_sft_warm_compile_refuses_unpacked_rows():
    from codechat.config.sft import SFTConfig, SFTStageConfig
    from codechat.config.stages import ModelConfig, TrainConfig
    from codechat.train.sft import warm_compile
    with pytest.raises(ConfigError, match="packing is off"):
        warm_compile(SFTStageConfig(sft=SFTConfig(packing=False), train=TrainConfig(compile=True, max_steps=1)),
                     ModelConfig())


class Jobs:
    """A stand-in for the speedrun, with the attributes :class:`BackgroundJobs` reads."""

    def __init__(self, job: Future, procs: list, estimate_s: float) -> None:
        from codechat.speedrun.plan import plan
        self.p = replace(plan(torch.device("cpu"), "tiny", 2.0), compile_estimate_s=estimate_s)
        self._warmup, self._warmup_procs, self._sft_warmup = job, procs, None


def test_pretraining_waits_for_the_warmup_at_most_its_compile_estimate_and_stops_a_late_one():
    from codechat.speedrun.background import BackgroundJobs
    done = Future()
    done.set_result(12.5)
    got = BackgroundJobs._wait_warmup(Jobs(done, [], 5.0), "pretrain")
    assert got["done"] and got["warmup_s"] == 12.5 and got["waited_s"] < 1.0
    failed = Future()
    failed.set_exception(RuntimeError("no GPU"))
    got = BackgroundJobs._wait_warmup(Jobs(failed, [], 5.0), "pretrain")
    assert not got["done"] and got["error"] == "RuntimeError: no GPU"
    proc = mp.get_context("spawn").Process(target=time.sleep, args=(60,))
    proc.start()
    t0 = time.monotonic()
    jobs = Jobs(Future(), [proc], 0.3)  # still compiling after its estimate: stopped, pretraining compiles itself
    got = BackgroundJobs._wait_warmup(jobs, "pretrain")
    proc.join(timeout=10)
    assert not got["done"] and 0.3 <= got["waited_s"] < 5 and time.monotonic() - t0 < 15
    assert not proc.is_alive() and jobs._warmup is None


def test_sfts_warmup_is_waited_for_within_its_own_bound_and_leaves_pretrainings_alone():
    from codechat.speedrun.background import BackgroundJobs
    pre, sft = Future(), Future()
    sft.set_result(3.5)
    jobs = Jobs(pre, [], 300.0)
    jobs._sft_warmup = sft
    got = BackgroundJobs._wait_warmup(jobs, "sft", 0.5)
    assert got["done"] and got["warmup_s"] == 3.5 and jobs._sft_warmup is None and jobs._warmup is pre
    jobs._sft_warmup = Future()  # still compiling: stopped at the bound given, not compile_estimate_s's 300 s
    t0 = time.monotonic()
    got = BackgroundJobs._wait_warmup(jobs, "sft", 0.3)
    assert not got["done"] and time.monotonic() - t0 < 5 and jobs._sft_warmup is None


def test_the_report_says_what_the_first_step_cost_and_what_the_warmup_did():
    from codechat.speedrun.report import _first_step
    assert _first_step({"first_step_s": 46.4}) == "46.4 s"
    assert _first_step({"first_step_s": 4.2, "compile_warmup": {"done": True, "warmup_s": 61.2, "waited_s": 17.1}}) \
        == "4.2 s; the graphs compiled beforehand in the background in 61 s (the stage waited 17 s for them)"
    assert _first_step({"first_step_s": 40.2, "compile_warmup": {"done": False, "waited_s": 46.0}}).endswith(
        "the background compile warm-up was stopped, late")
    assert _first_step({"first_step_s": 40.2, "compile_warmup": {"done": False, "waited_s": 0.0,
                                                                "error": "RuntimeError: x"}}).endswith("failed: RuntimeError: x")


def test_the_speedrun_starts_the_warmup_on_its_planned_config_and_collects_it(tmp_path, monkeypatch):
    from codechat.speedrun.plan import plan
    from codechat.speedrun.run import Speedrun
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    p = replace(plan(torch.device("cpu"), "tiny", 2.0), compile=True, compile_estimate_s=1.0)  # worth compiling
    s = Speedrun(p, tmp_path / "run", torch.device("cpu"), "cpu", 0, resume=False)
    s._start_warmup()
    assert s._warmup is None  # not on a CPU: its compile would only compete with the tokenizer and the corpus
    s.dev = torch.device("cuda")  # as on one GPU (the config still says cpu: it compiles here)
    s._start_warmup()  # before the tokenizer and the corpus exist: the warm-up needs neither
    assert s._warmup is not None and len(s._warmup_procs) == 1
    assert s._sft_warmup is not None  # chat SFT's, after it in the same process
    s.p = replace(s.p, compile_estimate_s=300.0)  # the wait's bound
    got = s._wait_warmup("pretrain")
    assert got["done"] and 0 < got["warmup_s"] and 0 < got["waited_s"] < 300
    assert (tmp_path / "inductor").is_dir() and not (tmp_path / "run" / "pretrain").exists()
    s._end_background()  # SFT's warm-up stopped: its compile is the test above's
    assert s._sft_warmup is None and not any(proc.is_alive() for proc in s._warmup_procs)
