"""What a new user meets first: ``codechat`` alone lists the commands, sampling flags show their
defaults, and input errors (an executors file, a busy port) come before torch and the model load."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codechat.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
#: Runs ``codechat.cli.main`` on argv, then prints its exit code and whether torch was imported.
PROBE = ("import sys; from codechat.cli import main; rc = main(sys.argv[1:]); "
         "print(rc, 'torch' in sys.modules)")


def test_codechat_alone_prints_the_list_of_commands(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith("usage: codechat [-h] COMMAND ...\n\nTrain your own code-chat model end to end.")
    for command, summary in [("speedrun", "tokenizer -> corpus"), ("chat", "talk to a chat model"),
                             ("serve", "an OpenAI-compatible API"), ("eval", "evaluate generated code")]:
        assert any(line.split()[:1] == [command] and summary in line for line in err.splitlines()), command
    assert err.rstrip().endswith("codechat: error: the following arguments are required: COMMAND")
    with pytest.raises(SystemExit):
        main(["eval"])  # a command whose subcommand is missing lists its subcommands too
    err = capsys.readouterr().err
    words = " ".join(err.split())  # argparse pads and wraps to the terminal's width
    assert "run sample HumanEval / MBPP solutions" in words and "filter keep problems" in words
    assert err.rstrip().endswith("codechat eval: error: the following arguments are required: eval_command")


@pytest.mark.parametrize("command, defaults", [
    ("chat", {"max_new_tokens": 256, "temperature": 0.7, "top_k": 0, "top_p": 0.95}),
    ("sample", {"max_new_tokens": 200, "temperature": 0.8, "top_k": 0, "top_p": 0.95}),
])
def test_sampling_flags_of_chat_and_sample_say_what_they_do_and_their_default(command, defaults, capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    actions = {a.dest: a for a in sub._actions}
    for dest, default in defaults.items():
        assert actions[dest].default == default and actions[dest].help, dest
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    assert "--max-new-tokens MAX_NEW_TOKENS tokens generated at most (default " \
           f"{defaults['max_new_tokens']}; the model's context caps it)" in text
    assert f"--temperature TEMPERATURE sampling temperature (default {defaults['temperature']}; 0: greedy)" in text
    assert "--top-k TOP_K sample among the k likeliest tokens (default 0: off)" in text
    assert "--top-p TOP_P nucleus sampling mass (default 0.95; 1: off)" in text


def test_a_bad_executors_file_is_reported_before_torch_loads(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PROBE, "funcall", "--model", tmp_path / "nowhere", "--executors",
                        bad, "--user", "hi"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.stdout.splitlines()[-1] == "2 False", p.stdout + p.stderr  # exit 2, torch never imported
    assert p.stderr.strip() == (f"codechat funcall: error: {bad}: does not import: SyntaxError: invalid syntax "
                                "(bad.py, line 1)")
    assert time.perf_counter() - t0 < 60


def test_serve_on_a_busy_port_says_so_before_the_model_loads(tmp_path, tok, tok_dir):
    import torch

    from codechat import checkpoint as ckpt
    from codechat.config.stages import ModelConfig, to_dict
    from codechat.model import build_model
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, n_layer=1, n_embd=32, n_head=2, n_kv_head=1,
                                    max_seq_len=64))
    ckpt.save(tmp_path / "sft" / "checkpoints", 1, model={k: v.to(torch.float32) for k, v in model.state_dict().items()},
              state={"step": 1, "meta": {"stage": "sft", "model": to_dict(model.cfg)}}, tokenizer_dir=tok_dir)
    code = ("import sys; import codechat.checkpoint as c\n"
            "def loaded(*a, **k): raise SystemExit('the model was loaded')\n"
            "c.load_model = loaded\n"
            "from codechat.cli import main; sys.exit(main(sys.argv[1:]))")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = subprocess.run([sys.executable, "-c", code, "serve", "--model", tmp_path / "sft", "--port", str(port)],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"codechat serve: error: cannot listen on 127.0.0.1:{port}: Address already in use (another server is "
        "listening there: stop it or choose another --port)"]
    p = subprocess.run([sys.executable, "-c", code, "serve", "--model", tmp_path / "sft", "--host", "192.0.2.1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)  # TEST-NET-1: never this machine's
    assert p.returncode == 2 and p.stderr.strip().startswith("codechat serve: error: cannot listen on 192.0.2.1:8000:")
    assert p.stderr.strip().endswith("(give an address of this machine as --host)")


@pytest.mark.parametrize("stage", ["pretrain", "sft", "rl"])
def test_resume_where_there_is_no_checkpoint_is_an_error_naming_the_directory(stage, tmp_path, capsys):
    out = tmp_path / "new"
    init = [] if stage == "pretrain" else ["--init", str(tmp_path)]
    assert main([stage, *init, "--max-steps", "2", "--out", str(out), "--resume"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"codechat {stage}: error: --resume: {out} holds no checkpoint to continue from (none in "
        f"{out / 'checkpoints'}); drop --resume to start a new run there")
    assert not out.exists()  # nothing trained from step 0
    (out / "checkpoints" / ".tmp-step_000002").mkdir(parents=True)  # a save that never finished is no checkpoint
    assert main([stage, *init, "--max-steps", "2", "--out", str(out), "--resume"]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("argv, error", [
    (["pretrain", "--max-steps", "-1"], "codechat pretrain: error: --max-steps must be >= 0, got -1"),
    (["pretrain", "--max-steps", "3", "--checkpoint-every-s", "-5"],
     "codechat pretrain: error: --checkpoint-every-s must be >= 0 (0: by steps only), got -5.0"),
    (["sft", "--init", ".", "--epochs", "-1"], "codechat sft: error: --epochs must be >= 0, got -1.0"),
    (["sft", "--init", ".", "--max-examples", "-2"],
     "codechat sft: error: --max-examples must be >= 0 (0: all), got -2"),
    (["rl", "--init", ".", "--dead-steps", "0"], "codechat rl: error: --dead-steps must be >= 1, got 0"),
    # a dotted override is named as typed, also over the flag
    (["pretrain", "--max-steps", "2", "--train.max_steps", "-3"],
     "codechat pretrain: error: train.max_steps must be >= 0, got -3"),
])
def test_a_bad_flag_value_is_named_by_the_flag_the_user_typed(argv, error, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == error


@pytest.mark.parametrize("value, why", [("-1", "must be > 0 minutes, got -1 (leave the flag out for no time limit)"),
                                        ("0", "must be > 0 minutes, got 0 (leave the flag out for no time limit)"),
                                        ("ten", "expected a number of minutes, got 'ten'")])
def test_a_bad_time_budget_is_a_usage_error_naming_the_flag(value, why, capsys):
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--time-budget-min", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith(f"codechat pretrain: error: argument --time-budget-min: {why}")
    assert "time_budget_s" not in err
