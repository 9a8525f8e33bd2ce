"""`codechat pretrain` and `codechat sample` end to end, as a user runs them (real subprocesses)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

SMALL = ["--preset", "tiny", "--model.n_layer", "2", "--model.n_embd", "64", "--model.n_head", "2",
         "--model.n_kv_head", "1", "--data.seq_len", "64", "--train.micro_batch_size", "4",
         "--train.eval_tokens", "512", "--train.log_every", "1", "--device", "cpu"]


def codechat(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "codechat", *args], capture_output=True, text=True, timeout=600)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def steps(out: Path) -> list[int]:
    return [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()]


def test_pretrain_writes_the_stage_layout_resumes_and_samples(tmp_path, tok_dir, corpus_dir):
    out = tmp_path / "pretrain"
    codechat("pretrain", *SMALL, "--data", str(corpus_dir), "--tokenizer", str(tok_dir), "--max-steps", "4",
             "--out", str(out), "--train.save_every", "2", "--train.eval_every", "2")
    assert (out / "config.yaml").is_file() and any((out / "tb").iterdir())
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step_000002", "step_000004"]
    assert steps(out) == [0, 1, 2, 3, 4]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["model"]["n_embd"] == 64 and saved["data"]["data_dir"] == str(corpus_dir)

    codechat("pretrain", *SMALL, "--config", str(out / "config.yaml"), "--max-steps", "6", "--out", str(out),
             "--resume", "--train.save_every", "2", "--train.eval_every", "2")
    assert steps(out) == [0, 1, 2, 3, 4, 5, 6]  # continued from step 4, nothing logged twice
    assert json.loads((out / "checkpoints/step_000006/state.json").read_text())["step"] == 6

    s = codechat("sample", "--model", str(out), "--prompt", "def main(", "--max-new-tokens", "12",
                 "--temperature", "0", "--device", "cpu")
    assert s.stdout.startswith("def main(") and len(s.stdout) > len("def main(\n")


def test_pretrain_builds_default_tokenizer_and_corpus_when_not_given(tmp_path):
    out = tmp_path / "x" / "pretrain"
    codechat("pretrain", *SMALL, "--max-steps", "2", "--out", str(out), "--data.max_files", "80",
             "--data.vocab_size", "512", "--data.val_fraction", "0.2")
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    index = json.loads((out / "data" / "index.json").read_text())
    assert index["vocab_size"] == 512 and index["splits"]["val"]["documents"] > 0
    assert steps(out)[-1] == 2


def test_bad_settings_are_one_line_errors_before_any_work(tmp_path, tok_dir, corpus_dir):
    cases = [
        (["--data.seq_len", "1024"], "data.seq_len=1024 is over the model's limit"),
        (["--data", str(tmp_path / "missing")], str(tmp_path / "missing")),
        (["--optim.lr", "0"], "optim.lr must be a positive number"),
        (["--optim.nope", "1"], "unknown setting --optim.nope"),
    ]
    for extra, message in cases:
        out = tmp_path / "run"
        p = codechat("pretrain", *SMALL, "--data", str(corpus_dir), "--tokenizer", str(tok_dir), "--max-steps", "1",
                     "--out", str(out), *extra, check=False)
        assert p.returncode == 2, p.stderr
        assert message in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert not out.exists()


def test_stage_flags_reach_the_config_including_checkpoint_every_s(tmp_path):
    """--checkpoint-every-s of pretrain / sft / rl sets train.save_every_s (it was once parsed and
    dropped); the run flags every stage shares land where they belong."""
    from codechat.cli import _stage_config, _stage_flags, build_parser, pretrain_config
    from codechat.config.sft import SFTStageConfig
    from codechat.train.grpo import RLStageConfig
    common = ["--checkpoint-every-s", "30", "--out", str(tmp_path / "o"), "--resume", "--seed", "7"]
    (tmp_path / "o" / "checkpoints" / "step_000001").mkdir(parents=True)  # what --resume continues from
    args, _ = build_parser().parse_known_args(["pretrain", "--preset", "tiny", "--max-steps", "3", *common])
    cfg = pretrain_config(args, {})
    assert (cfg.train.save_every_s, cfg.run.out, cfg.run.resume, cfg.run.seed) == (30.0, str(tmp_path / "o"), True, 7)
    for stage, cls, parallel in (("sft", SFTStageConfig, True), ("rl", RLStageConfig, False)):
        args, _ = build_parser().parse_known_args([stage, "--init", "x", *common])
        cfg = _stage_config(cls, None, _stage_flags(args, parallel), {})
        assert (cfg.init, cfg.train.save_every_s, cfg.run.resume, cfg.run.seed) == ("x", 30.0, True, 7), stage
