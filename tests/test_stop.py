"""Stopping a run before its end (``--stop-after-min``, SIGTERM) and resuming it (:mod:`codechat.train.stop`).

A stop at a step boundary writes a checkpoint, and the resumed run must be the uninterrupted one:
pretraining and SFT in step mode, stopped by a fake clock after step k and resumed, end with weights and
optimizer state bitwise equal to a run that was never stopped (RL's test is in ``test_rl_stage.py``,
beside its policy). The command line: exit status 75, one line naming the ``--resume`` command, SIGTERM
doing the same.
"""
from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from codechat import checkpoint as ckpt
from codechat.cli import main
from codechat.config.sft import SFTConfig, SFTStageConfig
from codechat.config.stages import OptimConfig, PretrainConfig, RunConfig, TrainConfig, load, pretrain_recipe
from codechat.train.pretrain import run_pretrain
from codechat.train.sft import run_sft
from codechat.train.stop import EXIT_STOPPED, RunStopped, StopWatch, resume_command, stop_watch

from conftest import save_random_base


def step_clock(stop_after_steps: int) -> StopWatch:
    """A watch on a fake clock that ticks once per call: the trainer asks it once at every step boundary
    (the watch's own first call is its start), so it is due before step ``stop_after_steps + 1``."""
    ticks = itertools.count()
    return StopWatch(stop_after_steps + 0.5, clock=lambda: float(next(ticks)))


def assert_same_checkpoint(a: Path, b: Path) -> None:
    """Two runs' newest checkpoints: the same step, and bitwise the same weights and optimizer state."""
    ca, cb = ckpt.load(a, with_optim=True), ckpt.load(b, with_optim=True)
    assert ca["state"]["step"] == cb["state"]["step"]
    assert ca["model"].keys() == cb["model"].keys()
    for k in ca["model"]:
        assert torch.equal(ca["model"][k], cb["model"][k]), k
    assert_bitwise_equal(ca["optim"], cb["optim"], "optim")
    assert ca["state"]["loader"] == cb["state"]["loader"]


def assert_bitwise_equal(a: object, b: object, where: str) -> None:
    """Nested dicts / lists of tensors and numbers (an optimizer's state dict) equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_bitwise_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bitwise_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_the_watch_is_due_at_its_time_and_names_the_flag():
    now = [0.0]
    w = StopWatch(90.0, clock=lambda: now[0])
    assert w.due() is None and w.left_s() == 90.0
    now[0] = 90.0
    assert w.due() == "--stop-after-min 1.5" and w.left_s() == 0.0
    with pytest.raises(RunStopped, match=r"stopped by --stop-after-min 1.5 at pretrain step 3"):
        w.check("pretrain step 3")
    assert StopWatch(None).due() is None and StopWatch(None).left_s() == float("inf")
    with pytest.raises(ValueError, match="--stop-after-min must be > 0, got -1"):
        stop_watch(-1)


def test_sigterm_marks_a_polled_section_and_stops_anything_else_at_once():
    w = StopWatch(None)
    with w.install():
        with w.polled():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs: it only marks the run
            assert w.due() == "SIGTERM"
        with pytest.raises(RunStopped, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_the_time_limit_stops_work_outside_a_training_loop():
    with StopWatch(0.05).install():
        t0 = time.monotonic()
        with pytest.raises(RunStopped, match="--stop-after-min"):
            time.sleep(5)
    assert time.monotonic() - t0 < 2


def test_the_resume_command_adds_resume_once():
    assert resume_command(["pretrain", "--out", "runs/a b", "--stop-after-min", "8"]) == \
        "codechat pretrain --out 'runs/a b' --stop-after-min 8 --resume"
    assert resume_command(["speedrun", "--resume"]) == "codechat speedrun --resume"


def pretrain_cfg(tok_dir: Path, corpus_dir: Path, out: Path, resume: bool = False) -> PretrainConfig:
    return load(PretrainConfig, None, {
        "model.n_layer": "2", "model.n_embd": "64", "model.n_head": "2", "model.n_kv_head": "1",
        "data.seq_len": "64", "data.tokenizer_dir": str(tok_dir), "data.data_dir": str(corpus_dir),
        "train.micro_batch_size": "4", "train.grad_accum": "2", "train.max_steps": "7", "train.time_budget_s": "0",
        "train.eval_every": "3", "train.eval_tokens": "256", "train.save_every": "1000", "train.log_every": "1",
        "run.out": str(out), "run.device": "cpu", "run.resume": str(resume).lower()}, base=pretrain_recipe("tiny"))


@pytest.mark.parametrize("k", [3, 5])
def test_pretraining_stopped_after_step_k_and_resumed_equals_the_run_never_stopped(tok_dir, corpus_dir, tmp_path, k):
    run_pretrain(pretrain_cfg(tok_dir, corpus_dir, tmp_path / "whole"), show_progress=False)
    with step_clock(k).install(), pytest.raises(RunStopped, match=f"at pretrain step {k}"):
        run_pretrain(pretrain_cfg(tok_dir, corpus_dir, tmp_path / "cut"), show_progress=False)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "cut" / "checkpoints")] == [f"step_{k:06d}"]
    run_pretrain(pretrain_cfg(tok_dir, corpus_dir, tmp_path / "cut", resume=True), show_progress=False)
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "cut")
    rows = [json.loads(ln) for ln in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 8))  # no step logged twice or skipped


@pytest.fixture(scope="module")
def base_model(tok, tok_dir, tmp_path_factory) -> Path:
    """A randomly initialised 2-layer model saved as a pretraining checkpoint, and a chat file to tune it on."""
    tmp = tmp_path_factory.mktemp("stop_sft")
    save_random_base(tok_dir, tok.vocab_size, tmp / "base")
    rng = random.Random(0)
    rows = [{"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                          {"role": "assistant", "content": f"{a} + {b} = {a + b}"}]}
            for a, b in ((rng.randrange(100), rng.randrange(100)) for _ in range(200))]
    (tmp / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp


def sft_cfg(base: Path, out: Path, resume: bool = False) -> SFTStageConfig:
    return SFTStageConfig(init=str(base / "base"), sft=SFTConfig(data=str(base / "sums.jsonl"), max_length=64,
                                                                 max_prompt_length=48, decontaminate=False),
                          optim=OptimConfig(lr=3e-3, warmup_steps=2, schedule="linear", min_lr_ratio=0.0),
                          train=TrainConfig(max_steps=6, epochs=0.0, micro_batch_size=8, log_every=1, eval_every=10**9,
                                            save_every=10**9),
                          run=RunConfig(out=str(out), device="cpu", resume=resume))


def test_sft_stopped_after_step_k_and_resumed_equals_the_run_never_stopped(base_model, tmp_path):
    run_sft(sft_cfg(base_model, tmp_path / "whole"), show_progress=False)
    with step_clock(2).install(), pytest.raises(RunStopped, match="at sft step 2"):
        run_sft(sft_cfg(base_model, tmp_path / "cut"), show_progress=False)
    run_sft(sft_cfg(base_model, tmp_path / "cut", resume=True), show_progress=False)
    assert_same_checkpoint(tmp_path / "whole", tmp_path / "cut")


def cli_pretrain(tok_dir: Path, corpus_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", "--data", str(corpus_dir), "--tokenizer", str(tok_dir), "--out", str(out), "--device", "cpu",
            "--model.n_layer", "2", "--model.n_embd", "64", "--model.n_head", "2", "--model.n_kv_head", "1",
            "--data.seq_len", "64", "--train.micro_batch_size", "4", "--train.log_every", "1", *extra]


def test_the_command_exits_75_naming_the_resume_command_and_resuming_finishes(tok_dir, corpus_dir, tmp_path,
                                                                              capsys, monkeypatch):
    out = tmp_path / "run"
    # the watch that main() installs, on a clock that ticks once per step boundary
    monkeypatch.setattr("codechat.train.stop.stop_watch", lambda m: step_clock(2) if m else StopWatch(None))
    args = cli_pretrain(tok_dir, corpus_dir, out, "--max-steps", "6", "--stop-after-min", "8")
    assert main(args) == EXIT_STOPPED
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("codechat pretrain: stopped by --stop-after-min ")
    assert err.endswith(f" at pretrain step 2; continue with: {resume_command(args)}")
    assert main([*args, "--resume"]) == EXIT_STOPPED  # a new invocation counts its own minutes: 2 more steps
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(" at pretrain step 4; continue with: "
                                                                     + resume_command(args))
    assert main([*args, "--resume"]) == 0
    assert ckpt.load(out)["state"]["step"] == 6


def test_a_training_command_writes_a_log_file_line_by_line(tmp_path, monkeypatch):
    # stdout redirected to a file is block-buffered (without PYTHONUNBUFFERED): a stage's lines could sit unwritten
    log = (tmp_path / "run.log").open("w")
    assert not log.isatty() and not log.line_buffering
    monkeypatch.setattr(sys, "stdout", log)
    assert main(["pretrain", "--data", str(tmp_path / "missing"), "--max-steps", "1", "--device", "cpu"]) == 2
    assert log.line_buffering
    log.close()


def test_sigterm_stops_a_training_command_at_a_step_boundary_with_its_checkpoint(tok_dir, corpus_dir, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "codechat", *cli_pretrain(tok_dir, corpus_dir, out, "--max-steps", "100000")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:  # training has begun once step 1 is logged
            if (out / "metrics.jsonl").is_file() and '"loss"' in (out / "metrics.jsonl").read_text():
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_STOPPED, err[-2000:]
    step = ckpt.load(out)["state"]["step"]
    assert step >= 1 and f"stopped by SIGTERM at pretrain step {step}; continue with: codechat pretrain" in err
