"""One resolver for every ``--model`` and ``--init`` (codechat.checkpoint.resolve): a checkpoint, a
stage directory, or a run directory (a speedrun's output) meaning its last code stage — ``rl/``,
else ``sft/``, else ``pretrain/`` (``funcall/`` first for ``codechat funcall``) — with the pick
printed. Real ``codechat chat`` / ``export`` / ``funcall`` subprocesses on a tiny saved model."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codechat import checkpoint as ckpt
from codechat.config.stages import ModelConfig, to_dict
from codechat.model import build_model


def save_stage(run: Path, stage: str, step: int, tok_dir: Path, vocab: int) -> Path:
    """A tiny random model saved as checkpoint ``step`` of ``run/stage``; returns the checkpoint."""
    torch.manual_seed(step)
    model = build_model(ModelConfig(vocab_size=vocab, n_layer=1, n_embd=32, n_head=2, n_kv_head=1, max_seq_len=64))
    return ckpt.save(run / stage / "checkpoints", step, model=model.state_dict(),
                     state={"step": step, "meta": {"stage": stage, "model": to_dict(model.cfg)}}, tokenizer_dir=tok_dir)


def codechat(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codechat", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_a_run_directory_means_its_last_code_stage_and_says_which(tmp_path, tok, tok_dir, caplog):
    run = tmp_path / "speedrun-tiny"
    pre = save_stage(run, "pretrain", 40, tok_dir, tok.vocab_size)
    sft = save_stage(run, "sft", 12, tok_dir, tok.vocab_size)
    (run / "rl").mkdir()  # RL skipped by the verdict: the folder may exist without a checkpoint
    (run / "metrics.json").write_text("{}")
    caplog.set_level(logging.INFO, logger="codechat")
    assert ckpt.resolve(run) == sft
    [rec] = caplog.records
    assert rec.name == "codechat.checkpoint" and rec.levelno == logging.INFO
    assert rec.message == f"{run} is a run directory: using its sft/ stage, {sft}"
    rl = save_stage(run, "rl", 5, tok_dir, tok.vocab_size)
    assert ckpt.resolve(run) == rl
    assert ckpt.resolve(run, ("pretrain",)) == pre
    assert ckpt.resolve(run / "sft") == sft and ckpt.resolve(sft) == sft  # stage and checkpoint: as before
    assert ckpt.load(run)["state"]["step"] == 5 and ckpt.load(run)["dir"] == rl
    caplog.clear()
    ckpt.resolve(run / "sft")
    assert caplog.records == []  # only a run directory's pick is said


def test_a_run_directory_without_any_checkpoint_is_one_clear_error(tmp_path):
    run = tmp_path / "run"
    (run / "rl").mkdir(parents=True)
    (run / "sft" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.resolve(run)
    assert str(e.value) == (f"{run}: a run directory whose rl/, sft/ hold no checkpoint "
                            f"(expected e.g. {run}/rl/checkpoints/step_NNNNNN/)")
    with pytest.raises(ckpt.CheckpointError, match="holds no checkpoint"):
        ckpt.resolve(tmp_path / "run" / "rl")


def test_chat_and_export_take_a_run_directory(tmp_path, tok, tok_dir):
    run = tmp_path / "speedrun-tiny"
    save_stage(run, "pretrain", 40, tok_dir, tok.vocab_size)
    sft = save_stage(run, "sft", 12, tok_dir, tok.vocab_size)
    p = codechat("chat", "--model", run, "--prompt", "hi", "--max-new-tokens", 4, "--seed", 0, "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == [f"codechat: {run} is a run directory: using its sft/ stage, {sft}"]
    p = codechat("export", "--model", run, "--out", tmp_path / "export")
    assert p.returncode == 0, p.stderr
    state = json.loads((tmp_path / "export" / "state.json").read_text())
    assert state["step"] == 12 and state["exported_from"] == str(sft)
    p = codechat("sample", "--model", tmp_path / "nothing-here", "--device", "cpu")
    assert p.returncode == 2 and p.stderr.strip() == \
        f"codechat sample: error: {tmp_path / 'nothing-here'}: no such checkpoint or run directory"


def test_funcall_takes_a_run_directory_and_prefers_its_funcall_stage(funcall_stage, tmp_path):
    stage, executors = funcall_stage  # a stage directory whose model calls weather()
    run = tmp_path / "run"
    (run / "funcall").mkdir(parents=True)  # a funcall stage without a checkpoint: the next one is taken
    (run / "sft").symlink_to(stage, target_is_directory=True)
    p = codechat("funcall", "--model", run, "--executors", executors, "--user", "Weather in Tokyo?", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip().endswith("It is 21 C in Tokyo.")
    picked = run / "sft" / "checkpoints" / "step_000120"
    assert f"codechat: {run} is a run directory: using its sft/ stage, {picked}" in p.stderr.splitlines()
    (run / "funcall").rmdir()
    (run / "funcall").symlink_to(stage, target_is_directory=True)
    (run / "rl").symlink_to(stage, target_is_directory=True)
    assert ckpt.resolve(run, ckpt.FUNCALL_STAGES) == run / "funcall" / "checkpoints" / "step_000120"
    assert ckpt.resolve(run) == run / "rl" / "checkpoints" / "step_000120"
